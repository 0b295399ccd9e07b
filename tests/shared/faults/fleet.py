"""The agents of one fault test: OS processes started, commanded and stopped through the
witness Redis, their final counts checked to reconcile exactly."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

from tests.shared.faults.witness import Witness

ROOT = Path(__file__).resolve().parents[3]

OUTCOMES = ("timeouts", "cancelled", "shed", "unavailable")


class AgentProcess:
    """One agent: `send()` a command, `ask()` one and wait for its answer."""

    def __init__(self, fleet: Fleet, name: str, process: subprocess.Popen[str]) -> None:
        self.fleet = fleet
        self.name = name
        self.process = process
        self.final: dict[str, Any] | None = None

    def send(self, op: str, **arguments: Any) -> None:
        self.fleet.witness.client.rpush(f"ctl:{self.name}", json.dumps({"op": op, **arguments}))

    def answer(self, within: float = 30.0) -> dict[str, Any]:
        deadline = time.monotonic() + within
        while True:
            item = self.fleet.witness.client.blpop([f"ack:{self.name}"], timeout=0.5)
            if item is not None:
                return dict(json.loads(item[1]))
            if self.process.poll() is not None:
                raise AssertionError(f"agent {self.name} exited: {self.output()}")
            if time.monotonic() > deadline:
                log = self.fleet.log(self.name)[-6000:]
                raise AssertionError(f"agent {self.name} did not answer within {within} s:\n{log}")

    def ask(self, op: str, within: float = 30.0, **arguments: Any) -> dict[str, Any]:
        self.send(op, **arguments)
        reply = self.answer(within)
        assert "error" not in reply or op == "connect", (self.name, op, reply)
        return reply

    def stop(self, within: float = 30.0) -> dict[str, Any]:
        self.final = self.ask("stop", within)
        self.process.wait(10)
        return self.final

    def output(self) -> str:
        if self.process.poll() is None:
            return "(running)"
        out, err = self.process.communicate()
        return f"exit {self.process.returncode}\n{out}\n{err}"


class Fleet:
    """Starts agents on one limit key; `stop()` stops them and checks their counts."""

    def __init__(self, witness: Witness, key: str, folder: Path) -> None:
        self.witness = witness
        self.key = key
        self.folder = folder
        self.agents: dict[str, AgentProcess] = {}

    def start(
        self,
        name: str,
        url: str,
        limit: int,
        *,
        connect: bool = True,
        wait: bool = True,
        weights: list[int] | None = None,
        flows: list[str | None] | None = None,
        **options: Any,
    ) -> AgentProcess:
        config = {
            "name": name,
            "url": url,
            "witness_url": self.witness.url,
            "key": self.key,
            "limit": limit,
            "options": options,
            "connect": connect,
            "weights": weights,
            "flows": flows,
            "seed": len(self.agents),
        }
        env = {**os.environ, "PYTHONPATH": str(ROOT)}
        log = open(self.folder / f"agent-{name}.log", "w")  # noqa: SIM115 - the agent keeps it
        process = subprocess.Popen(
            [sys.executable, "-m", "tests.shared.faults.agent", json.dumps(config)],
            cwd=ROOT,
            env=env,
            stdout=subprocess.PIPE,
            stderr=log,
            text=True,
        )
        log.close()
        agent = AgentProcess(self, name, process)
        self.agents[name] = agent
        if wait:
            self.wait_ready(agent)
        return agent

    def wait_ready(self, *agents: AgentProcess, within: float = 30.0) -> None:
        deadline = time.monotonic() + within
        names = {a.name for a in agents}
        while not names <= set(self.witness.client.lrange("ready", 0, -1)):
            for agent in agents:
                if agent.process.poll() is not None:
                    raise AssertionError(f"agent {agent.name} exited: {agent.output()}")
            assert time.monotonic() < deadline, f"agents {names} not ready"
            time.sleep(0.02)

    def log(self, name: str) -> str:
        return (self.folder / f"agent-{name}.log").read_text(errors="replace")

    def stop(self) -> dict[str, dict[str, Any]]:
        """Stop every agent still running; each one's final counts."""
        for agent in self.agents.values():
            if agent.final is None and agent.process.poll() is None:
                agent.send("stop")
        for agent in self.agents.values():
            if agent.final is None and agent.process.poll() is None:
                agent.final = agent.answer(60)
                agent.process.wait(10)
        return {name: a.final for name, a in self.agents.items() if a.final is not None}

    def kill(self) -> None:
        for agent in self.agents.values():
            if agent.process.poll() is None:
                agent.process.kill()
                agent.process.communicate()


def unreconciled(finals: dict[str, dict[str, Any]]) -> list[str]:
    """Agents whose arrivals differ from admitted + timeouts + cancelled + shed + unavailable
    (the limit's own counts), or that still hold or queue something after stopping. With
    `redis_unavailable="local"`, `unavailable` counts the admissions sent to the fallback
    (admitted there, or timed out, cancelled or shed there too), so arrivals are admitted +
    timeouts + cancelled + shed, and `unavailable` at least the fallback's admissions."""
    wrong = []
    for name, final in finals.items():
        seen, counted = final["seen"], final["counted"]
        if final["mode"] == "local":
            ended = seen["admitted"] + sum(counted[k] for k in OUTCOMES if k != "unavailable")
            fits = ended == seen["arrived"] and counted["unavailable"] >= seen["fallback"]
        else:
            fits = seen["admitted"] + sum(counted[k] for k in OUTCOMES) == seen["arrived"]
        if not fits or final["active"] or final["queue_depth"]:
            wrong.append(f"{name}: {final}")
    return wrong


def hold_all(
    holder: AgentProcess,
    limit: int,
    others: list[tuple[AgentProcess, dict[str, Any]]],
    **options: Any,
) -> None:
    """`holder` takes every slot, then each of `others` (an agent and its `demand` arguments)
    demands again and queues behind it. The others' clients stop first, and what they hold
    or queue drains: fair queuing by flow would keep giving their flows a share of every
    slot that frees (the holder's default flow would never hold the whole limit), and a
    heavy waiter of theirs chosen next would wait for the slots the holder keeps."""
    for agent, demand in others:
        agent.ask("demand", **{**demand, "clients": 0})
    deadline = time.monotonic() + 30
    for agent, _ in others:
        while (counts := agent.ask("counts"))["active"] or counts["queue_depth"]:
            assert time.monotonic() < deadline, (agent.name, counts)
            time.sleep(0.02)
    held = holder.ask("hold", slots=limit, **options)
    assert held == {"held": limit}, held
    for agent, demand in others:
        agent.ask("demand", **demand)

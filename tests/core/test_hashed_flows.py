"""Flow ids of credentials (gym_concurrency.hashed_flows): the documented HMAC, labels by id,
the key made per process (warned of once), and the command printing a credential's id."""

from __future__ import annotations

import os
import re
import subprocess
import sys

from hypothesis import given
from hypothesis import strategies as st

from gym_concurrency.hashed_flows import FlowHasher, hashed_flow
from gym_concurrency.limits.shared._checks import check_ask

ID = re.compile(r"^h:[0-9a-f]{16}$")


def test_the_id_is_h_and_the_first_16_hex_of_hmac_sha256() -> None:
    # RFC 4231, test case 2: HMAC-SHA256("Jefe", "what do ya want for nothing?") = 5bdcc146...
    assert hashed_flow("what do ya want for nothing?", b"Jefe") == "h:5bdcc146bf60754e"
    assert hashed_flow(b"what do ya want for nothing?", b"Jefe") == "h:5bdcc146bf60754e"
    assert hashed_flow("what do ya want for nothing?", b"other key") != "h:5bdcc146bf60754e"


@given(st.one_of(st.text(), st.binary()), st.binary(min_size=1, max_size=64))
def test_every_id_is_a_flow_any_limit_takes(value: str | bytes, key: bytes) -> None:
    # Whatever the credential (NUL, any length), its id fits a global limit's flow rules.
    flow = hashed_flow(value, key)
    assert ID.match(flow)
    assert check_ask("a limit", 1, flow, None) == flow


def test_a_label_names_its_id_and_other_ids_stay_ids() -> None:
    key = b"k" * 32
    team_a = hashed_flow("Bearer team-a-token", key)
    hasher = FlowHasher(key, {team_a: "team-a"})
    assert hasher("Bearer team-a-token") == "team-a"
    assert hasher("Bearer someone-else") == hashed_flow("Bearer someone-else", key)
    assert "k" * 8 not in repr(hasher)


def run_python(code: str, **env: str) -> subprocess.CompletedProcess[str]:
    variables = {k: v for k, v in os.environ.items() if not k.startswith("GYM_CONCURRENCY_")}
    return subprocess.run(
        [sys.executable, "-c", code],
        capture_output=True,
        text=True,
        timeout=60,
        env={**variables, **env},
    )


def test_the_key_made_per_process_is_warned_of_once_and_kept() -> None:
    run = run_python(
        "from gym_concurrency.hashed_flows import process_flow_key\n"
        "keys = {process_flow_key() for _ in range(3)}\n"
        "assert len(keys) == 1 and len(keys.pop()) == 32\n"
    )
    assert run.returncode == 0, run.stderr
    assert run.stderr.count("flow_key is not set") == 1, run.stderr
    assert "GYM_CONCURRENCY_FLOW_KEY" in run.stderr


def test_two_processes_make_two_keys() -> None:
    code = (
        "from gym_concurrency.hashed_flows import process_flow_key\nprint(process_flow_key().hex())"
    )
    assert run_python(code).stdout != run_python(code).stdout


def test_the_command_prints_the_id_of_each_line_under_the_key() -> None:
    key = "a-deployment-secret-of-32-chars!"
    run = subprocess.run(
        [sys.executable, "-m", "gym_concurrency.hashed_flows"],
        input="Bearer sk-team-a\nBearer sk-team-b\r\n",
        capture_output=True,
        text=True,
        timeout=60,
        env={**os.environ, "GYM_CONCURRENCY_FLOW_KEY": key},
    )
    assert run.returncode == 0, run.stderr
    assert run.stdout.split() == [
        hashed_flow("Bearer sk-team-a", key.encode()),
        hashed_flow("Bearer sk-team-b", key.encode()),
    ]


def test_the_command_needs_the_key() -> None:
    run = subprocess.run(
        [sys.executable, "-m", "gym_concurrency.hashed_flows"],
        input="Bearer sk-team-a\n",
        capture_output=True,
        text=True,
        timeout=60,
        env={k: v for k, v in os.environ.items() if k != "GYM_CONCURRENCY_FLOW_KEY"},
    )
    assert (run.returncode, run.stdout) == (2, "")
    assert "GYM_CONCURRENCY_FLOW_KEY is not set" in run.stderr

"""The load each engine reports, read by its default gauge names: vLLM as it renders its
/metrics (prometheus_client, through the fake engine), before and after 0.9's cache rename,
SGLang, trtllm-serve and Triton's TensorRT-LLM backend; several series summed or the largest
taken, narrowed by label, and unusable values (NaN, negative) left out."""

from __future__ import annotations

import math

import pytest
from prometheus_client import generate_latest

from benchmarks._fake_engine import FakeEngine
from gym_concurrency.engines import (
    SGLANG,
    TRITON_TRTLLM,
    TRTLLM_SERVE,
    VLLM,
    EngineLoad,
    EngineMetrics,
    Gauge,
    read_load,
)
from gym_concurrency.engines.gauges import engine_metrics


def vllm_body(legacy: bool = False, waiting: int = 0, running: int = 0) -> bytes:
    engine = FakeEngine(batch=4, kv_tokens=100, model_name="m", legacy_names=legacy)
    engine.running, engine.running_tokens = running, 25 * running
    engine.waiting.extend((None, 1) for _ in range(waiting))  # type: ignore[misc]
    return generate_latest(engine.registry)


@pytest.mark.parametrize("legacy", [False, True])
def test_vllm_as_it_renders_its_metrics_before_and_after_the_cache_rename(legacy: bool) -> None:
    body = vllm_body(legacy, waiting=3, running=2)
    assert (b"vllm:gpu_cache_usage_perc" in body) is legacy
    assert read_load(body, VLLM) == EngineLoad(waiting=3.0, cache_usage=0.5, running=2.0)


def test_the_new_cache_name_is_read_first_when_both_are_served() -> None:
    body = (
        'vllm:gpu_cache_usage_perc{engine="0",model_name="m"} 0.9\n'
        'vllm:kv_cache_usage_perc{engine="0",model_name="m"} 0.4\n'
        'vllm:num_requests_waiting{engine="0",model_name="m"} 0\n'
    )
    assert read_load(body, VLLM) == EngineLoad(0.0, 0.4, None)


def test_several_engines_queues_are_summed_and_the_fullest_cache_counts() -> None:
    body = "".join(
        f'vllm:num_requests_waiting{{engine="{i}",model_name="m"}} {w}\n'
        f'vllm:kv_cache_usage_perc{{engine="{i}",model_name="m"}} {c}\n'
        for i, (w, c) in enumerate([(2, 0.25), (5, 0.75), (1, 0.5)])
    )
    assert read_load(body, VLLM) == EngineLoad(8.0, 0.75, None)
    one = VLLM.with_labels(engine="1")
    assert read_load(body, one) == EngineLoad(5.0, 0.75, None)
    assert read_load(body, VLLM.with_labels(model_name="other")) == EngineLoad(None, None, None)


def test_unusable_values_are_left_out_and_infinity_means_full() -> None:
    body = (
        'vllm:num_requests_waiting{engine="0"} NaN\n'
        'vllm:num_requests_waiting{engine="1"} -1\n'
        'vllm:num_requests_waiting{engine="2"} 2\n'
        'vllm:kv_cache_usage_perc{engine="0"} +Inf\n'
    )
    assert read_load(body, VLLM) == EngineLoad(2.0, math.inf, None)
    assert read_load("vllm:num_requests_waiting NaN\n", VLLM) == EngineLoad(None, None, None)


def test_sglang_trtllm_serve_and_triton_read_by_their_own_names() -> None:
    sglang = (
        "# TYPE sglang:num_queue_reqs gauge\n"
        'sglang:num_queue_reqs{model_name="q",tp_rank="0"} 7.0\n'
        'sglang:token_usage{model_name="q",tp_rank="0"} 0.31\n'
        'sglang:num_running_reqs{model_name="q",tp_rank="0"} 12.0\n'
    )
    assert read_load(sglang, SGLANG) == EngineLoad(7.0, 0.31, 12.0)
    trtllm = (
        "trtllm_num_requests_waiting 4\ntrtllm_kv_cache_utilization 0.6\n"
        "trtllm_num_requests_running 30\n"
    )
    assert read_load(trtllm, TRTLLM_SERVE) == EngineLoad(4.0, 0.6, 30.0)
    triton = "".join(
        f'nv_trt_llm_request_metrics{{model="t",request_type="{kind}",version="1"}} {n}\n'
        for kind, n in [("active", 40), ("scheduled", 32), ("waiting", 8)]
    ) + "".join(
        f'nv_trt_llm_kv_cache_block_metrics{{kv_cache_block_type="{kind}",model="t"}} {n}\n'
        for kind, n in [("max", 1000), ("used", 900), ("fraction", 0.9)]
    )
    assert read_load(triton, TRITON_TRTLLM) == EngineLoad(8.0, 0.9, 32.0)


def test_engines_are_named_and_gauges_are_checked() -> None:
    assert engine_metrics("sglang") is SGLANG
    custom = EngineMetrics(Gauge(("q",)), Gauge(("c",), combine="max"))
    assert engine_metrics(custom) is custom
    with pytest.raises(ValueError, match="unknown engine 'tgi': expected one of vllm, sglang"):
        engine_metrics("tgi")
    with pytest.raises(ValueError, match="names must be Prometheus metric names"):
        Gauge(("not a name",))
    with pytest.raises(ValueError, match="names must be"):
        Gauge(())
    with pytest.raises(ValueError, match="labels must be"):
        Gauge(("q",), (("bad-label", "x"),))
    with pytest.raises(ValueError, match="combine must be 'sum' or 'max'"):
        Gauge(("q",), combine="mean")  # type: ignore[arg-type]


def test_a_body_over_the_cap_reads_nothing() -> None:
    body = vllm_body()
    assert read_load(body, VLLM, max_bytes=len(body) - 1) is None

"""Reading samples out of a Prometheus text exposition: the format's corners by example, and
by hypothesis: any text is read without raising, a rendered exposition reads back exactly,
and a body cut anywhere reads exactly its complete lines."""

from __future__ import annotations

import math
from dataclasses import dataclass

from hypothesis import example, given, settings
from hypothesis import strategies as st

from gym_concurrency.engines.exposition import read_samples

W = "vllm:num_requests_waiting"


def values(body: str, name: str = W) -> list[float]:
    found = read_samples(body, [name])
    assert found is not None
    return [s.value for s in found.get(name, [])]


def test_help_type_and_comment_lines_are_skipped_and_every_series_is_read() -> None:
    body = (
        f"# HELP {W} Number of requests waiting to be processed.\n"
        f"# TYPE {W} gauge\n"
        '# a comment with a } and a " in it\n'
        "\n"
        f'{W}{{engine="0",model_name="m"}} 3.0\n'
        f'{W}{{engine="1",model_name="m"}} 4\n'
        f"{W}_other 9\n"
    )
    found = read_samples(body, [W])
    assert found is not None
    assert [(s.labels, s.value) for s in found[W]] == [
        ({"engine": "0", "model_name": "m"}, 3.0),
        ({"engine": "1", "model_name": "m"}, 4.0),
    ]


def test_label_values_with_escapes_commas_and_braces_read_unescaped() -> None:
    body = f'{W}{{a="x\\"y",b="c\\\\",d="1,2}}",e="l\\nm",f="\\q"}} 1\n'
    [sample] = read_samples(body, [W])[W]  # type: ignore[index]
    assert sample.labels == {"a": 'x"y', "b": "c\\", "d": "1,2}", "e": "l\nm", "f": "\\q"}


def test_nan_infinities_timestamps_blanks_and_crlf() -> None:
    body = (
        f"{W} NaN\n{W} +Inf\n{W} -Inf 1700000000000\n"
        f'\t{W} {{ a = "1" , }}\t 2.5e1   -12 \r\n{W}{{}} 7\n'
    )
    got = values(body)
    assert math.isnan(got[0])
    assert got[1:] == [math.inf, -math.inf, 25.0, 7.0]


def test_a_last_line_without_a_line_feed_was_cut_short_and_is_not_read() -> None:
    assert values(f"{W} 1\n{W} 12") == [1.0]  # never the 1 of a cut 12.0
    assert values(f"{W} 12") == []


def test_a_malformed_line_is_skipped_alone() -> None:
    body = (
        f'{W} 1\n{W} 1_000\n{W} ٣\n{W}{{a=1}} 2\n{W}{{a="1"b="2"}} 3\n{W}{{a="1" 4\n'
        f"{W} 0x10\n{W}5\n{W} 6 7 8\n{W} 9\n"
    )
    assert values(body) == [1.0, 9.0]


def test_a_body_over_the_cap_is_refused_whole() -> None:
    body = f"{W} 1\n" * 100
    assert read_samples(body, [W], max_bytes=len(body)) is not None
    assert read_samples(body, [W], max_bytes=len(body) - 1) is None
    assert read_samples(body.encode(), [W], max_bytes=len(body) - 1) is None


def test_bytes_that_are_not_utf8_are_read_around() -> None:
    found = read_samples(b"\xff\xfe\n" + f'{W}{{a="\xe9"}} 2\n'.encode("latin-1"), [W])
    assert found is not None
    assert [s.value for s in found[W]] == [2.0]


@settings(max_examples=300, deadline=None)
@given(st.one_of(st.text(), st.binary().map(bytes)))
@example(f'{W}{{a="' + "\\" * 5000 + "x")
@example(f"{W}{{" + 'a="b",' * 2000)
def test_any_text_reads_without_raising(body: str | bytes) -> None:
    found = read_samples(body, [W, "a", "x"])
    assert found is not None
    assert all(isinstance(s.value, float) for samples in found.values() for s in samples)


@dataclass(frozen=True)
class Rendered:
    text: str
    samples: list[tuple[int, str, dict[str, str], float]]  # (its line's end, name, labels, value)


NAMES = [W, "vllm:kv_cache_usage_perc", f"{W}_total", "other"]
blank = st.sampled_from([" ", "\t", "  ", " \t"])
label_names = st.sampled_from(["model_name", "engine", "le", "a_b", "_x"])
floats = st.floats(allow_nan=True, allow_infinity=True)


def escaped(value: str) -> str:
    return value.replace("\\", "\\\\").replace('"', '\\"').replace("\n", "\\n")


def go_float(value: float) -> str:
    if math.isnan(value):
        return "NaN"
    if math.isinf(value):
        return "+Inf" if value > 0 else "-Inf"
    return repr(value)


@st.composite
def expositions(draw: st.DrawFn) -> Rendered:
    text, samples = "", []
    for _ in range(draw(st.integers(0, 12))):
        kind = draw(st.sampled_from(["sample", "sample", "help", "type", "comment", "blank"]))
        name = draw(st.sampled_from(NAMES))
        if kind == "help":
            help_text = draw(st.text(st.characters(codec="utf-8", exclude_characters="\n\r")))
            text += f"# HELP {name} {help_text}\n"
        elif kind == "type":
            text += f"# TYPE {name} {draw(st.sampled_from(['gauge', 'counter', 'untyped']))}\n"
        elif kind == "comment":
            text += f"#{draw(st.text(st.characters(codec='utf-8', exclude_characters=chr(10))))}\n"
        elif kind == "blank":
            text += draw(st.sampled_from(["", " ", "\t"])) + "\n"
        else:
            labels = draw(
                st.dictionaries(label_names, st.text(st.characters(codec="utf-8")), max_size=3)
            )
            value = draw(floats)
            pairs = ",".join(f'{k}="{escaped(v)}"' for k, v in labels.items())
            line = name + (f"{{{pairs}}}" if labels or draw(st.booleans()) else "")
            line += draw(blank) + go_float(value)
            if draw(st.booleans()):
                line += draw(blank) + str(draw(st.integers(-(10**13), 10**13)))
            text += line + "\n"
            if name in (W, "vllm:kv_cache_usage_perc"):
                samples.append((len(text), name, labels, value))
    return Rendered(text, samples)


def same(found: list[tuple[dict[str, str], float]], expected: list[tuple[dict[str, str], float]]):
    assert len(found) == len(expected)
    for (labels, value), (want_labels, want) in zip(found, expected, strict=True):
        assert labels == want_labels
        assert value == want or (math.isnan(value) and math.isnan(want))


@settings(max_examples=300, deadline=None)
@given(expositions(), st.data())
def test_a_rendered_exposition_reads_back_and_a_cut_one_reads_its_complete_lines(
    rendered: Rendered, data: st.DataObject
) -> None:
    cut = data.draw(st.integers(0, len(rendered.text)))
    for body, kept in ((rendered.text, len(rendered.text)), (rendered.text[:cut], cut)):
        found = read_samples(body.encode(), [W, "vllm:kv_cache_usage_perc"])
        assert found is not None
        for name in (W, "vllm:kv_cache_usage_perc"):
            expected = [
                (labels, value)
                for end, named, labels, value in rendered.samples
                if end <= kept and named == name
            ]
            same([(s.labels, s.value) for s in found.get(name, [])], expected)

"""The documents' generated parts (the top README, benchmarks/README.md and
benchmarks/search/README.md) are the script's output from the data files, and every generated
figure names the file it comes from."""

from __future__ import annotations

import re

import pytest

from benchmarks import claims

TEXTS = {doc: doc.read_text() for doc in claims.DOCUMENTS}
TOP, BENCHMARKS, SEARCH = claims.DOCUMENTS
README = TEXTS[BENCHMARKS]
PARTS = claims.generate()


@pytest.mark.parametrize("doc", claims.DOCUMENTS, ids=claims.name_of)
def test_each_committed_document_is_the_scripts_output(doc) -> None:
    text = TEXTS[doc]
    assert claims.quoted(text), f"{claims.name_of(doc)} has no generated part"
    assert claims.differing(text, PARTS) == [], "run `python -m benchmarks.claims` and commit the documents"
    assert claims.render(text, PARTS) == text


def test_every_part_is_quoted_and_the_check_passes() -> None:
    assert claims.unquoted(list(TEXTS.values())) == []
    assert claims.stale(TEXTS, PARTS) == []


def _edit_inside(text: str, name: str, old: str, new: str) -> str:
    start = text.index(f"<!-- claims:{name} -->")
    end = text.index(f"<!-- /claims:{name} -->")
    body = text[start:end]
    assert old in body
    return text[:start] + body.replace(old, new, 1) + text[end:]


@pytest.mark.parametrize(
    ("doc", "name", "old", "new"),
    [
        (BENCHMARKS, "defaults-spread", "10.8%", "1.9%"),  # the run-to-run spread, typed over
        (BENCHMARKS, "packed-job", "| 6962 (n=1) |", "| 6992 (n=1) |"),  # a throughput in a table
        (BENCHMARKS, "engines-headline", "vLLM 32.6 s", "vLLM 40.7 s"),  # a median, typed by hand
        (BENCHMARKS, "verl-lanes", "| +28.4% |", "| +18.4% |"),  # a prediction's error
        (TOP, "search-h200-headline", "median 480 GPU-seconds", "median 380 GPU-seconds"),
        (TOP, "packed-job-top", "ran at 5916 tokens/s/GPU", "ran at 5961 tokens/s/GPU"),
        (TOP, "engines-top", "leaves 14% fewer", "leaves 4% fewer"),
        (TOP, "load-test", "with 0 errors", "with no errors"),
        (SEARCH, "search-cpu-compare", "696 [45-never]", "596 [45-never]"),  # compare.py's table
        (SEARCH, "search-cpu-shows", "a median of 18 proposals", "a median of 13 proposals"),
        (SEARCH, "search-h200-landscape", "took 153 s", "took 100 s"),
    ],
    ids=lambda v: claims.name_of(v) if hasattr(v, "relative_to") else None,
)
def test_a_figure_edited_by_hand_is_caught_and_regenerated(doc, name, old, new) -> None:
    edited = _edit_inside(TEXTS[doc], name, old, new)
    assert claims.differing(edited, PARTS) == [name]
    (line,) = claims.stale({doc: edited} | {d: t for d, t in TEXTS.items() if d != doc}, PARTS)
    assert line.startswith(f"{claims.name_of(doc)} differs") and line.endswith(f": {name}")
    assert claims.render(edited, PARTS) == TEXTS[doc]


def test_the_check_names_the_document_and_the_part(tmp_path, monkeypatch, capsys) -> None:
    copies = []
    for doc in claims.DOCUMENTS:
        copy = tmp_path / claims.name_of(doc)
        copy.parent.mkdir(parents=True, exist_ok=True)
        copy.write_text(TEXTS[doc])
        copies.append(copy)
    monkeypatch.setattr(claims, "ROOT", tmp_path)
    monkeypatch.setattr(claims, "DOCUMENTS", tuple(copies))
    monkeypatch.setattr(claims, "generate", lambda: PARTS)
    top = copies[0]
    top.write_text(_edit_inside(TEXTS[TOP], "packed-job-top", "reached 6962", "reached 7962"))
    assert claims.main(["--check"]) == 1
    assert capsys.readouterr().out == (
        "README.md differs from `python -m benchmarks.claims` in: packed-job-top\n"
    )
    assert claims.main([]) == 0
    assert top.read_text() == TEXTS[TOP]
    assert claims.main(["--check"]) == 0


def test_hand_written_text_outside_the_markers_is_kept() -> None:
    for doc, anchor in ((BENCHMARKS, "## On the GPU host"), (TOP, "## Rollout engines"), (SEARCH, "## H200")):
        edited = TEXTS[doc].replace(anchor, f"A hand-written 123 line.\n\n{anchor}", 1)
        assert edited != TEXTS[doc]
        assert claims.render(edited, PARTS) == edited and claims.differing(edited, PARTS) == []


def test_a_part_quoted_by_no_document_or_unknown_to_the_script_is_reported() -> None:
    name = "packed-job-headline"
    start, end = README.index(f"<!-- claims:{name} -->"), README.index(f"<!-- /claims:{name} -->")
    without = README[:start] + README[end + len(f"<!-- /claims:{name} -->") :]
    others = [t for d, t in TEXTS.items() if d != BENCHMARKS]
    assert claims.unquoted([without, *others]) == [name]
    assert claims.stale({BENCHMARKS: without}, PARTS)[-1].startswith("no document quotes:")
    with pytest.raises(KeyError, match="not in benchmarks.claims.CLAIMS"):
        claims.render("<!-- claims:nobody -->\n<!-- /claims:nobody -->\n", PARTS)


def test_a_part_may_sit_in_several_documents() -> None:
    name = "search-h200-headline"
    body = "".join(line.text + "\n" for line in PARTS[name])
    both = f"<!-- claims:{name} -->\nstale 1\n<!-- /claims:{name} -->\n"
    assert claims.render(both, PARTS) == f"<!-- claims:{name} -->\n{body}<!-- /claims:{name} -->\n"
    texts = {TOP: TEXTS[TOP], SEARCH: TEXTS[SEARCH] + "\n" + both}
    assert claims.stale(texts, PARTS)[0] == (
        f"{claims.name_of(SEARCH)} differs from `python -m benchmarks.claims` in: {name}"
    )


def test_every_generated_figure_names_existing_data() -> None:
    for name, lines in PARTS.items():
        for line in lines:
            if re.search(r"\d", line.text):
                assert line.sources, (name, line.text)
            for source in line.sources:
                path = source.split("#")[0]
                assert list(claims.HERE.glob(path)), (name, source)


def test_no_measured_figure_outside_the_generated_parts_of_the_top_and_search_readmes() -> None:
    """Hand-written text carries no throughput, GPU-seconds or speed-up: those are generated
    (percentages there are settings, such as the 97% of the best a search must reach)."""
    figure = re.compile(r"\b\d[\d.,]*\s*(tok(ens)?/s|GPU-s)|(?<![\d.])\d+(\.\d+)?x\b")
    for doc in (TOP, SEARCH):
        outside = claims.MARK.sub("", TEXTS[doc])
        found = [m.group(0) for m in figure.finditer(outside)]
        assert found == [], (claims.name_of(doc), found)


def test_the_sources_name_each_lines_documents_and_data() -> None:
    listed = claims.sources(TEXTS, PARTS)
    (line,) = [s for s in listed if s.startswith("README.md: search-h200-headline: ")]
    assert line.endswith("<- search/results/qwen2.5-1.5b-h200.json, search/landscapes/qwen2.5-1.5b-h200.json")
    assert any(s.startswith("benchmarks/search/README.md: search-cpu-compare: ") for s in listed)


def test_figures_before_the_packed_layout_are_marked_obsolete_and_later_ones_are_not() -> None:
    assert PARTS["report-1.5b"][0].text.startswith("*Obsolete")
    assert PARTS["tp-sweep"][0].text.startswith("*Obsolete")
    assert PARTS["engines-top"][0].text.startswith("*Obsolete")
    assert "measured before the packed-sequence layout" in PARTS["search-h200-headline"][0].text
    assert not any("Obsolete" in line.text for line in PARTS["packed-job"] + PARTS["packed-job-top"])


def test_single_runs_without_measured_noise_make_no_claim_and_gaps_inside_the_spread_tie() -> None:
    (headline,) = PARTS["packed-job-headline"]
    assert "single runs: no claim" in headline.text
    (top,) = PARTS["packed-job-top"]
    assert "1.177x, single runs: no claim" in top.text
    (tp,) = PARTS["tp-sweep-headline"]
    assert "a tie within the 10.8% run-to-run spread" in tp.text
    engines = "\n".join(line.text for line in PARTS["engines-top"])
    assert "all ties within the 10.8% run-to-run spread" in engines
    assert "1.052x, a tie within the 10.8% run-to-run spread" in engines
    allocator = PARTS["verl-lanes-controls"][0].text
    assert "Medians 4347 against 4110 (1.058x), the band their spreads give 9.0%: a tie." in allocator


def test_a_finished_jobs_headline_says_when_the_search_first_reached_the_winners_tie_band() -> None:
    """The composed Qwen2-7B job: verl's example ties the winner and the search's own trial 4,
    one run inside the winner's band, ran long before the winner did; the Qwen2.5-1.5B job's
    first config inside the band is its winner, so its line says nothing more."""
    from benchmarks.claims.top import JOB_1P5B, JOB_7B_COMPOSED
    from benchmarks.gpu.report import first_tied, gpu_seconds_to

    (composed,) = PARTS["job-7b-composed-top"]
    job = claims.data.job_of(JOB_7B_COMPOSED)
    trials, summary = job["trials"], job["summary"]
    tied, best = first_tied(trials, summary, proposed=True), summary["best"]
    assert tied is not None and tied < best
    assert gpu_seconds_to(trials, tied) < gpu_seconds_to(trials, best)
    assert (
        f"the winner first ran after {gpu_seconds_to(trials, best) / 60:.0f} GPU-minutes, the search's "
        f"first config inside its tie band (trial {tied}) after {gpu_seconds_to(trials, tied) / 60:.0f}."
    ) in composed.text
    assert f"{JOB_7B_COMPOSED}#{tied}" in composed.sources
    assert (
        "verl's example command ran at 4136 (n=3, spread 1.6%): a tie, inside the 8.4% tie band"
        in composed.text
    )
    (first,) = PARTS["job-top"]
    one = claims.data.job_of(JOB_1P5B)
    assert first_tied(one["trials"], one["summary"], proposed=True) == one["summary"]["best"]
    assert "tie band (trial" not in first.text


def _sides_file(path, runs: list[tuple[str, dict[str, float]]]):
    """A cross design's sides file of one config, with these (status, metrics) runs."""
    import json

    points = [{"config": {}, "runs": [{"status": s, "metrics": m} for s, m in runs]}]
    path.write_text(json.dumps({"points": points}))
    return str(path)


def test_the_hosts_plain_python_work_is_each_kinds_ok_runs_median_range_and_count(
    tmp_path, monkeypatch
) -> None:
    """Each kind of host's time for the work every run does whatever its config, from its
    ok runs only (a failed run's timing is left out); a figure one kind lacks is no row."""
    from benchmarks.claims import search

    small = _sides_file(
        tmp_path / "16.json",
        [
            ("ok", {"engine_import_s": 5.0, "train_model_build_s": 6.0}),
            ("ok", {"engine_import_s": 6.0, "train_model_build_s": 7.0}),
            ("ok", {"engine_import_s": 4.0}),
            ("oom", {"engine_import_s": 99.0}),
        ],
    )
    large = _sides_file(
        tmp_path / "32.json", [("ok", {"engine_import_s": 4.0}), ("ok", {"engine_import_s": 4.0})]
    )
    monkeypatch.setattr(search, "CROSS_SIDES", (small, large))
    header, _, row = search.cross_host_work()
    assert header.text.startswith("| per run | 16 CPUs")
    assert row.text == "| vLLM's import | 5.0 (4.0-6.0; 3) | 4.0 (4.0; 2) | 1.25x |"
    assert row.sources == (small, large)
    monkeypatch.setattr(search, "CROSS_SIDES", (small, _sides_file(tmp_path / "none.json", [])))
    assert [line.text for line in search.cross_host_work()] == [
        "No run of either kind of host timed its imports yet."
    ]


def test_verls_measured_update_weights_are_its_measured_steps_calls() -> None:
    """The worker's first ``update_weights`` is verl's ``on_init_end`` and step k's is call
    k + 1: with four steps, the first a warm-up, the measured calls are 3-5."""
    from benchmarks.claims.update_weights_gc import measured_calls

    trace = [{"call": "update_weights", "call_number": n, "full_gcs": float(n)} for n in range(1, 6)]
    trace.insert(2, {"call": "forward_backward_batch", "call_number": 3})
    verl = {"steps": [{}] * 4, "warmup_steps": 1, "trace": trace}
    assert [c["call_number"] for c in measured_calls(verl)] == [3, 4, 5]
    assert all(c["call"] == "update_weights" for c in measured_calls(verl))
    verl["warmup_steps"] = 2  # a longer warm-up leaves fewer measured
    assert [c["call_number"] for c in measured_calls(verl)] == [4, 5]
    assert measured_calls({"steps": [{}] * 4}) == []  # an untraced run


def _edited(monkeypatch, module, rel: str, part):
    """Renders ``part`` from ``rel``'s data as ``edit`` changes it: ``rendered(edit) -> text``."""
    import copy

    measured = module.load(rel)

    def rendered(edit) -> str:
        doc = copy.deepcopy(measured)
        edit(doc)
        monkeypatch.setattr(module, "load", lambda _: doc)
        return "\n".join(line.text for line in part())

    return rendered


def test_verls_own_run_to_run_spread_decides_whether_the_trials_offset_from_verl_ties(monkeypatch) -> None:
    """The trials' offset from verl's one run (the code A/B's host) is a tie inside the spread
    of verl's runs on one host, a gap outside it; one verl run states no spread."""
    import copy
    import importlib

    verl_spread = importlib.import_module("benchmarks.claims.verl_spread")  # the module, not its part
    text = "\n".join(line.text for line in PARTS["verl-spread-h100"])
    assert "-6% off verl's one run" in text and "differ by 10%" in text and "a tie, not a gap" in text

    rendered = _edited(monkeypatch, verl_spread, verl_spread.VERL_SPREAD_H100, verl_spread.verl_spread)

    def alike(doc) -> None:  # the second run's steps as the first's: no spread between runs
        first, second = (r for r in doc["runs"] if r["status"] == "ok")
        second["steps"] = copy.deepcopy(first["steps"])

    assert "differ by 0%: that offset lies outside verl's run-to-run spread on one host, a gap" in rendered(
        alike
    )
    alone = rendered(lambda doc: doc["runs"].pop())
    assert "One run of verl's defaults finished; its median step was 9.097 s." in alone
    assert "a tie" not in alone and "a gap" not in alone


def test_trial_and_verl_interleaved_tie_inside_the_wider_sides_spread(monkeypatch) -> None:
    """Trials and verl's runs in turn on one host: the trials' median step against verl's median
    run ties inside the larger of the two sides' spreads and is shorter outside it; the host's
    first trial is named where it is the slowest in every timer."""
    import importlib

    verl_spread = importlib.import_module("benchmarks.claims.verl_spread")  # the module, not its part
    text = "\n".join(line.text for line in PARTS["verl-interleaved-h100"])
    assert "is -13% off verl's median run (9.499 s), inside the larger" in text
    assert "of the two sides' run-to-run spreads (43%): a tie" in text
    assert "longer than the 2 later ones in 6 of the 6 timers" in text
    assert "the later trials' steps are each shorter than every one of verl's" in text

    rendered = _edited(
        monkeypatch, verl_spread, verl_spread.VERL_INTERLEAVED_H100, verl_spread.verl_interleaved
    )

    def warm_first(doc) -> None:  # the first trial as fast as the third: the trials spread 1%
        first, third = (r for r in doc["runs"] if r["kind"] == "trial" and r["round"] in (0, 2))
        first["step_time_s"] = third["step_time_s"] - 0.1

    warm = rendered(warm_first)
    assert "outside the larger of the two sides' run-to-run spreads (9%): the trials' step is shorter" in warm

    def one_verl(doc) -> None:
        doc["runs"] = [r for r in doc["runs"] if r["kind"] == "trial" or r["round"] == 0]

    alone = rendered(one_verl)
    assert "one run on a side gives no run-to-run spread: no claim" in alone and "a tie" not in alone
    unprobed = rendered(lambda doc: doc["host_speed"].pop("end"))  # the host's release came first
    assert "8.04 us per small op before the first run (`benchmarks/gpu/host_speed.py`)" in unprobed

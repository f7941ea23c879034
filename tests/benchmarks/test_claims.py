"""benchmarks/README.md's generated parts are the script's output from the data files, and
every generated figure names the file it comes from."""

from __future__ import annotations

import re

import pytest

from benchmarks import claims

README = claims.README.read_text()


def test_the_committed_readme_is_the_scripts_output() -> None:
    assert claims.differing(README) == [], "run `python -m benchmarks.claims` and commit the README"
    assert claims.render(README) == README


def _edit_inside(text: str, name: str, old: str, new: str) -> str:
    start = text.index(f"<!-- claims:{name} -->")
    end = text.index(f"<!-- /claims:{name} -->")
    body = text[start:end]
    assert old in body
    return text[:start] + body.replace(old, new, 1) + text[end:]


@pytest.mark.parametrize(
    ("name", "old", "new"),
    [
        ("defaults-spread", "10.8%", "1.9%"),  # the run-to-run spread, typed over
        ("packed-job", "| 6962 (n=1) |", "| 6992 (n=1) |"),  # a throughput in a table
        ("engines-headline", "vLLM 32.6 s", "vLLM 40.7 s"),  # a median, typed by hand
    ],
)
def test_a_figure_edited_by_hand_is_caught_and_regenerated(name, old, new) -> None:
    edited = _edit_inside(README, name, old, new)
    assert claims.differing(edited) == [name]
    assert claims.render(edited) == README


def test_hand_written_text_outside_the_markers_is_kept() -> None:
    edited = README.replace("## On the GPU host", "A hand-written 123 line.\n\n## On the GPU host", 1)
    assert claims.render(edited) == edited and claims.differing(edited) == []


def test_a_part_missing_from_the_readme_or_unknown_to_the_script_is_reported() -> None:
    name = "packed-job-headline"
    start, end = README.index(f"<!-- claims:{name} -->"), README.index(f"<!-- /claims:{name} -->")
    without = README[:start] + README[end + len(f"<!-- /claims:{name} -->") :]
    assert claims.differing(without) == [name]
    with pytest.raises(KeyError, match="not in benchmarks.claims.CLAIMS"):
        claims.render("<!-- claims:nobody -->\n<!-- /claims:nobody -->\n")


def test_every_generated_figure_names_existing_data() -> None:
    for name, lines in claims.generate().items():
        for line in lines:
            if re.search(r"\d", line.text):
                assert line.sources, (name, line.text)
            for source in line.sources:
                path = source.split("#")[0]
                assert list(claims.HERE.glob(path)), (name, source)


def test_figures_before_the_packed_layout_are_marked_obsolete_and_later_ones_are_not() -> None:
    parts = claims.generate()
    assert parts["report-1.5b"][0].text.startswith("*Obsolete")
    assert parts["tp-sweep"][0].text.startswith("*Obsolete")
    assert not any("Obsolete" in line.text for line in parts["packed-job"])


def test_single_runs_without_measured_noise_make_no_claim_and_gaps_inside_the_spread_tie() -> None:
    (headline,) = claims.generate()["packed-job-headline"]
    assert "single runs: no claim" in headline.text
    (tp,) = claims.generate()["tp-sweep-headline"]
    assert "a tie within the 10.8% run-to-run spread" in tp.text

"""docs/problem-files.md is generated from the spec's field descriptions, and says every field."""

from __future__ import annotations

from autoshard import docs_gen
from autoshard.spec import Problem


def test_committed_problem_file_reference_is_the_generated_one():
    committed = docs_gen.PAGE.read_text(encoding="utf-8")
    assert committed == docs_gen.render(), "docs/problem-files.md is stale: run `python -m autoshard.docs_gen`"


def test_every_field_of_every_section_is_described_with_its_default_and_range():
    text = docs_gen.render()
    for _title, _where, cls in docs_gen.SECTIONS:
        for name, field in cls.model_fields.items():
            assert field.description, f"{cls.__name__}.{name} has no Field(description=...)"
            assert f"| `{name}` |" in text
    row = next(line for line in text.splitlines() if line.startswith("| `num_gpus` |"))
    assert "**required**" in row and ">= 1, <= 1,048,576" in row  # ClusterSpec: ge=1, le=MAX_GPUS = 2**20
    row = next(line for line in text.splitlines() if line.startswith("| `oversubscription` |"))
    assert "| `1.0` |" in row and ">= 1, <= 64" in row
    assert Problem.model_fields["framework"].default == "megatron" and "| `framework` |" in text


def test_check_mode_reports_a_stale_page(tmp_path, monkeypatch, capsys):
    page = tmp_path / "problem-files.md"
    monkeypatch.setattr(docs_gen, "PAGE", page)
    assert docs_gen.main(["--check"]) == 1 and "stale" in capsys.readouterr().err
    assert docs_gen.main([]) == 0 and docs_gen.main(["--check"]) == 0

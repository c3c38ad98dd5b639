"""The decode benchmark checks what it times: each program's first decode step against onnxruntime's in the
same run, and ``--check`` every step of a conversation, teacher-forced (on the tiny zoo:llama_past; the
commands run on the 125 M decoders in docs/generation.md)."""

from relaxc.benchmarks import generation


def _rows(out: str, spec: str) -> list[list[str]]:
    return [[cell.strip() for cell in line.split("|")[1:-1]] for line in out.splitlines() if line.startswith(f"| {spec}")]


def test_the_decode_benchmark_checks_the_logits_of_the_programs_it_times(capsys, monkeypatch):
    monkeypatch.setenv("TVM_NUM_THREADS", "2")  # the benchmark sets it for its threads: restored after
    assert generation.main(["zoo:llama_past", "--cached", "8", "24", "--steps", "2"]) == 0
    rows = _rows(capsys.readouterr().out, "zoo:llama_past")
    assert [row[1] for row in rows] == ["8", "24"]
    assert all(float(row[5]) <= generation.CHECK_TOLERANCE for row in rows), rows


def test_the_check_compares_every_step_compiled_and_loaded(capsys, monkeypatch):
    monkeypatch.setenv("TVM_NUM_THREADS", "2")
    assert generation.main(["--check", "zoo:llama_past", "--steps", "8", "--batch", "2"]) == 0
    (row,) = _rows(capsys.readouterr().out, "zoo:llama_past")
    assert all(float(cell) <= generation.CHECK_TOLERANCE for cell in row[1:]), row

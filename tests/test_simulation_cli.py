"""`mbalancer simulate ...` and `mbalancer demo` as scripts use them: output contract, files, bad arguments."""
import csv
import json
import signal
import subprocess
import sys

import pytest

from experiments.simulation.figures import CSV_COLUMNS, FIGURES
from experiments.simulation.scenario import Scenario, simulate

CONTRACT = ["simulate", "imbalance", "--servers", "10", "--keys", "1000", "--hot", "10", "--groups", "1",
            "--alpha", "1.0", "--mode", "equal", "--trials", "2000", "--seed", "1", "--json"]


def test_imbalance_json_contract(run_cli):
    result = run_cli(*CONTRACT)
    assert result.returncode == 0, result.stderr
    lines = result.stdout.strip().splitlines()
    assert len(lines) == 1, "exactly one JSON object on stdout"
    report = json.loads(lines[0])
    assert report["inputs"] == {"servers": 10, "keys": 1000, "hot": 10, "groups": 1, "alpha": 1.0,
                                "mode": "equal", "trials": 2000, "seed": 1}
    low, high = report["ci95"]
    assert low < report["imbalance_factor"] < high
    # The command reports the library's own answer, not a second copy of the model.
    assert report["imbalance_factor"] == simulate(Scenario()).summary()["imbalance_factor"]
    assert report["baseline"]["mean"] < report["imbalance_factor"]


def test_imbalance_human_output(run_cli):
    result = run_cli("simulate", "imbalance", "--trials", "200", "--mode", "weighted")
    assert result.returncode == 0, result.stderr
    assert "imbalance factor, weighted" in result.stdout and "95% CI" in result.stdout


def test_auto_hot_reports_h_and_memory(run_cli):
    result = run_cli("simulate", "imbalance", "--hot", "auto", "--target", "0.9", "--trials", "300", "--json")
    assert result.returncode == 0, result.stderr
    report = json.loads(result.stdout)
    assert report["auto"]["reached"] and report["imbalance_factor"] >= 0.9
    assert report["extra_copies"] == report["inputs"]["hot"] * 9
    assert report["memory_overhead"] == pytest.approx(report["extra_copies"] / 1000)


def test_auto_hot_unreachable_exits_1_with_a_reason(run_cli):
    result = run_cli("simulate", "imbalance", "--hot", "auto", "--target", "0.95", "--mode", "move",
                     "--trials", "50")
    assert result.returncode == 1
    assert "not reached" in result.stderr


@pytest.mark.parametrize("args,needle", [
    (["--servers", "-4"], "--servers"), (["--keys", "0"], "--keys"), (["--trials", "-1"], "--trials"),
    (["--hot", "-2"], "--hot"), (["--hot", "1001"], "--hot"), (["--hot", "ten"], "--hot"),
    (["--groups", "3"], "--groups"), (["--groups", "-1"], "--groups"), (["--alpha", "0"], "--alpha"),
    (["--alpha", "-0.5"], "--alpha"), (["--alpha", "nan"], "--alpha"), (["--mode", "fair"], "--mode"),
    (["--servers", "x"], "--servers"), (["--hot", "auto"], "--target"), (["--target", "0.9"], "--target"),
    (["--hot", "auto", "--target", "1.5"], "--target"), (["--seed", "-3"], "--seed"),
    (["--keys", "100000000000"], "at most 10,000,000"), (["--keys", "5000000", "--trials", "2000"], "lower --trials"),
])
def test_bad_arguments_exit_2_with_a_clear_error(run_cli, args, needle):
    result = run_cli("simulate", "imbalance", *args)
    assert result.returncode == 2, (args, result.stdout, result.stderr)
    assert needle in result.stderr
    assert "Traceback" not in result.stderr
    assert result.stdout == ""


def test_figure_writes_csv_and_png(run_cli, tmp_path):
    result = run_cli("simulate", "figure", "4.3", "--out", str(tmp_path), "--trials", "60")
    assert result.returncode == 0, result.stderr
    with open(tmp_path / "fig4.3.csv") as f:
        rows = list(csv.DictReader(f))
    spec = FIGURES["4.3"]
    assert tuple(rows[0]) == CSV_COLUMNS
    assert len(rows) == len(spec.x_values) * len(spec.curves)
    assert {r["mode"] for r in rows} == {"equal", "weighted"}
    assert (tmp_path / "fig4.3.png").read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    assert (tmp_path / "fig4.3.png").stat().st_size > 20_000


def test_figure_point_agrees_with_the_imbalance_command(run_cli, tmp_path):
    assert run_cli("simulate", "figure", "3.2", "--out", str(tmp_path), "--trials", "80").returncode == 0
    with open(tmp_path / "fig3.2.csv") as f:
        row = next(r for r in csv.DictReader(f) if r["servers"] == "20" and r["mode"] == "weighted")
    single = json.loads(run_cli("simulate", "imbalance", "--servers", "20", "--mode", "weighted",
                                "--trials", "80", "--json").stdout)
    assert float(row["mean"]) == pytest.approx(single["imbalance_factor"], rel=1e-12)


def test_every_figure_has_a_weighted_curve():
    for spec in FIGURES.values():
        assert any(c.mode == "weighted" for c in spec.curves), spec.name


def test_figure_out_that_cannot_be_written_exits_2(run_cli, tmp_path):
    (tmp_path / "file").write_text("not a folder")
    for out in ("/proc/mbalancer-figures", str(tmp_path / "file")):
        result = run_cli("simulate", "figure", "4.3", "--out", out, "--trials", "10")
        assert result.returncode == 2 and "--out: cannot make" in result.stderr and "Traceback" not in result.stderr


def test_figure_bad_arguments_exit_2(run_cli, tmp_path):
    for args in (["9.9"], ["3.1", "--trials", "0"], ["3.1", "--hot", "5000"], ["3.1", "--alpha", "-1"], ["3.1"]):
        extra = [] if args == ["3.1"] else ["--out", str(tmp_path)]
        result = run_cli("simulate", "figure", *args, *extra)
        assert result.returncode == 2, args
        assert "Traceback" not in result.stderr
    assert not list(tmp_path.iterdir()), "nothing is written for a bad call"


def test_demo_prints_table_plots_and_a_json_line(run_cli, tmp_path):
    result = run_cli("demo", "--out", str(tmp_path), "--trials", "100")
    assert result.returncode == 0, result.stderr
    assert "MBalancer, equal, G=1" in result.stdout
    last = json.loads(result.stdout.strip().splitlines()[-1])
    assert last["gain"] > 1.3 and last["mbalancer"]["imbalance_factor"] > last["baseline"]["imbalance_factor"]
    for name in FIGURES:
        assert (tmp_path / "simulation" / f"fig{name}.png").exists()
        assert (tmp_path / "simulation" / f"fig{name}.csv").exists()


def test_ctrl_c_stops_politely(tmp_path):
    """SIGINT mid-run: exit 130 with one line saying so and what was written, no traceback."""
    from tests.conftest import MBALANCER
    command = [str(MBALANCER), "simulate", "figure", "all", "--trials", "2000", "--out", str(tmp_path)]
    # SIGINT as a terminal's Ctrl-C finds it: a run started from a background job inherits it ignored (bash does
    # that to `cmd &` without job control), and Python then never raises KeyboardInterrupt. A small Python of its own
    # restores it and execs the command (same PID): not a preexec_fn, which runs Python in a fork of this process,
    # whose other threads (gRPC's, from earlier tests) make that unsafe (in CI once it left SIGINT ignored).
    restore = ("import os, signal, sys; signal.signal(signal.SIGINT, signal.SIG_DFL); "
               "os.execv(sys.argv[1], sys.argv[1:])")
    process = subprocess.Popen([sys.executable, "-c", restore, *command], stdout=subprocess.PIPE,
                               stderr=subprocess.PIPE, text=True)
    try:
        process.stderr.readline()  # the first progress line: the run is under way
        for _ in range(10):  # again if it did not stop (CI with two CPU hogs once saw a run go on to its end)
            process.send_signal(signal.SIGINT)
            try:
                _, err = process.communicate(timeout=3)
                break
            except subprocess.TimeoutExpired:
                continue
    finally:
        process.kill()
    assert process.returncode == 130 and "interrupted" in err and "Traceback" not in err, err[-2000:]
    assert f"written in {tmp_path}" in err


def test_version(run_cli):
    result = run_cli("--version")
    assert result.returncode == 0 and result.stdout.startswith("mbalancer 0.")


def test_every_option_of_every_command_says_what_it_is():
    import argparse
    from mbalancer.cli import build_parser

    def silent(parser: argparse.ArgumentParser, path: str) -> list[str]:
        found = []
        for action in parser._actions:
            if isinstance(action, argparse._SubParsersAction):
                for name, sub in action.choices.items():
                    found += silent(sub, f"{path} {name}")
            elif not action.help and action.dest != "help":
                found.append(f"{path} {'/'.join(action.option_strings) or action.dest}")
        return found
    assert silent(build_parser(), "mbalancer") == []

"""Runs record what produced them: commit, dirty flag, package versions, machine."""

from __future__ import annotations

import json
import platform
import subprocess
from pathlib import Path

import pytest
import torch

from ac_extensions.cli.train import main
from ac_extensions.runtime.provenance import code_version, cpu_model, package_versions, provenance

ROOT = Path(__file__).resolve().parents[2]


def git(*args: str) -> str:
    return subprocess.run(["git", "-C", str(ROOT), *args], capture_output=True, text=True).stdout


def test_code_version_is_the_checkouts_head_and_its_dirty_flag():
    if not git("rev-parse", "HEAD").strip():
        pytest.skip("not a git checkout")
    record = code_version()
    assert record["commit"] == git("rev-parse", "HEAD").strip()
    status = git("status", "--porcelain", "--untracked-files=no").splitlines()
    dirty = any(not line[3:].startswith("benchmarks/results/") for line in status)
    assert record["dirty"] is dirty


def test_dirty_means_code_changed_not_the_results_pages(tmp_path):
    def run(*args):
        subprocess.run(["git", "-C", str(tmp_path), *args], check=True, capture_output=True)

    (tmp_path / "pkg").mkdir()
    (tmp_path / "benchmarks" / "results").mkdir(parents=True)
    (tmp_path / "pkg" / "code.py").write_text("x = 1\n")
    (tmp_path / "benchmarks" / "results" / "table.md").write_text("| a |\n")
    run("init", "-q")
    run("add", ".")
    run("-c", "user.name=t", "-c", "user.email=t@t", "commit", "-qm", "first")
    assert code_version(tmp_path)["dirty"] is False
    (tmp_path / "benchmarks" / "results" / "table.md").write_text("| b |\n")
    (tmp_path / "new_untracked.py").write_text("")
    assert code_version(tmp_path)["dirty"] is False
    (tmp_path / "pkg" / "code.py").write_text("x = 2\n")
    assert code_version(tmp_path)["dirty"] is True


def test_outside_a_checkout_the_commit_is_unknown(tmp_path):
    assert code_version(tmp_path) == {"commit": None, "dirty": None}


def test_versions_and_machine():
    versions = package_versions(("no-such-package-here",))
    assert versions["torch"] and versions["torchrl"] and versions["python"]
    assert versions["no-such-package-here"] is None
    record = provenance()
    assert record["machine"]["cpus"] >= 1 and record["started"].endswith("+00:00")
    assert record["machine"]["cpu"] == cpu_model()
    assert record["machine"]["cpu_capability"] == torch.backends.cpu.get_cpu_capability()


def test_cpu_model_reads_the_model_name(tmp_path):
    cpuinfo = tmp_path / "cpuinfo"
    cpuinfo.write_text("processor\t: 0\nvendor_id\t: AuthenticAMD\nmodel name\t: AMD EPYC 9R14\n")
    assert cpu_model(cpuinfo) == "AMD EPYC 9R14"
    cpuinfo.write_text("processor\t: 0\n")
    assert cpu_model(cpuinfo) == (platform.processor() or platform.machine())
    assert cpu_model(tmp_path / "missing") == (platform.processor() or platform.machine())


@pytest.mark.timeout(300)
def test_ac_train_records_one_entry_per_start(tmp_path):
    out = tmp_path / "run"
    assert main(["ppo", "--frames", "1024", "--out", str(out), "--quiet"]) == 0
    first = json.loads((out / "run.json").read_text())["code"]
    assert len(first) == 1 and first[0]["versions"]["torchrl"]
    assert main(["ppo", "--resume", str(out), "--frames", "2048", "--quiet"]) == 0
    second = json.loads((out / "run.json").read_text())["code"]
    assert len(second) == 2 and second[0] == first[0]
    assert second[1]["code"] == code_version()

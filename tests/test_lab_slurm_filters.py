"""Tests of roles/lab_slurm/filter_plugins/hpcobs_lab_slurm.py: which AccountingStorageTRES need slurmdbd."""
from __future__ import annotations

import importlib.util
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[1]
_spec = importlib.util.spec_from_file_location(
    "hpcobs_lab_slurm", REPO / "roles" / "lab_slurm" / "filter_plugins" / "hpcobs_lab_slurm.py"
)
f = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(f)
problems = f.hpcobs_lab_slurm_accounting_problems


@pytest.mark.parametrize("accounting", [False, True])
def test_built_in_tres_and_other_settings_need_nothing(accounting):
    extra = ["PrologFlags=DeferBatch", "AccountingStorageTRES=cpu,Mem,energy,node,billing,vmem,pages,fs/disk"]
    assert problems(extra, accounting) == []
    assert problems([], accounting) == []


@pytest.mark.parametrize("tres", ["gres/gpu", "GRES/gpu", "license/matlab", "bb/datawarp", "fs/lustre", "ic/ofed"])
def test_a_tres_outside_the_built_in_ones_needs_slurmdbd(tres):
    extra = ["AccountingStorageTRES=cpu, %s" % tres]
    found = problems(extra, False)
    assert len(found) == 1 and tres in found[0] and "lab_slurm_accounting: true" in found[0], found
    assert "slurmdbd is required to run with TRES" in found[0]
    assert problems(extra, True) == []


def test_each_tres_needing_slurmdbd_is_named():
    found = problems(["AccountingStorageTRES=gres/gpu,license/a"], False)
    assert [("gres/gpu" in p, "license/a" in p) for p in found] == [(True, False), (False, True)]


@pytest.mark.parametrize("tres", ["gpu", "gres/", "disk", "foo/bar"])
def test_an_unknown_tres_is_refused_with_or_without_slurmdbd(tres):
    for accounting in (False, True):
        found = problems(["AccountingStorageTRES=%s" % tres], accounting)
        assert len(found) == 1 and "Unknown tres type" in found[0], found


@pytest.mark.parametrize("line", ["AccountingStorageType=accounting_storage/slurmdbd", "AccountingStorageHost=db1",
                                  "accountingstorageport=6819"])
def test_the_accounting_storage_is_the_roles_own(line):
    for accounting in (False, True):
        found = problems([line], accounting)
        assert len(found) == 1 and "lab_slurm_accounting" in found[0], found


def test_not_a_list():
    assert problems("AccountingStorageTRES=gres/gpu", False)

"""The grids shipped for the papers' tables: each validates, says what it is, and every cell of
the classification stand-ins trains (one step, on synthetic images in place of the grid's data;
the smartwatch IMU grids keep their own small 1D data)."""

from __future__ import annotations

import pytest
import torch

from fedaug.config.load import parse_config
from fedaug.engine.run import build_simulation
from fedaug.report.grid import GRID_DIR, GRIDS, KINDS, load_grid

#: grids whose data is segmentation (no synthetic stand-in for their cells)
SEGMENTATION = {"vfda_table2_brain_mri", "vfda_sites_brain_mri_3d"}


def test_the_papers_tables_have_grids():
    for name in ("fedfa_table1_digits4", "fedfa_table4_digits4", "fedfa_table5_digits4", "fedfa_table6_digits4",
                 "fedfa_table7_digits4", "fedfa_table8_digits4", "fedfa_fig2_digits4", "fedrdn_table1_digits4",
                 "flea_table1_fmnist", "flea_fig2_fmnist", "vfda_table2_brain_mri", "vfda_sites_brain_mri_3d",
                 "fedfa_table1_paper"):
        assert name in GRIDS


@pytest.mark.parametrize("name", sorted(GRIDS))
def test_grid_validates_and_says_what_it_is(name):
    spec = load_grid(name)
    assert spec.kind in KINDS and spec.description and spec.reproduces and spec.notes and GRIDS[name]
    assert name.endswith("_paper") == (spec.kind == "paper")
    assert (GRID_DIR / f"{name}.toml").read_text().startswith("# ")


@pytest.mark.slow
@pytest.mark.parametrize("name", sorted(n for n in GRIDS if not n.endswith("_paper") and n not in SEGMENTATION))
def test_every_stand_in_cell_trains(name):
    # The cells' threads = 1, applied as the CLI would (build_simulation leaves the process's threads alone):
    # at the suite's default 2 threads beside another busy pytest process on 2 cores, torch's threads wait on
    # each other and the grid takes 10-30x as long (flea_table1_fmnist: 288 s against 10 s alone).
    torch.set_num_threads(1)
    spec = load_grid(name)
    for setting in spec.settings:
        for method in spec.methods:
            raw = spec.raw(setting, method, 0)
            if raw["data"]["name"] != "smartwatch_imu":  # 1D windows: small and offline, kept as they are
                raw["data"] = {"name": "synthetic", "options": {"num_clients": 4, "samples_per_client": 16, "size": 16}}
            raw["train"].update(rounds=1, local_steps=1, batch_size=8, participation=1.0)
            raw["train"].pop("local_epochs", None)
            raw.update(eval={"best_by": "test"}, threads=1)
            summary = build_simulation(parse_config(raw)).run()
            assert summary["rounds"] == 1, (setting, method)

"""speculators' ArrowDataset with every position in the loss (train's `--loss-on all`).

A module-level class, so that DataLoader workers started by spawn unpickle it by name; per row,
so that a large dataset is never copied (speculators_compat.supervise_every_position checks the
code it relies on and swaps it in)."""

from __future__ import annotations

import torch
from speculators.train.data import ArrowDataset


class EveryPositionDataset(ArrowDataset):
    """Rows as ArrowDataset gives them, with a loss mask of ones."""

    def _get_raw_data(self, index: int):
        row = super()._get_raw_data(index)
        if isinstance(row, dict):  # not SampleUnavailable
            row["loss_mask"] = torch.ones_like(row["loss_mask"])
        return row

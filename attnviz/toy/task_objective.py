"""The objective a toy model's heads are judged by: its task's own loss (see :mod:`attnviz.models.objective`)."""

from __future__ import annotations

from typing import TYPE_CHECKING

from torch import Tensor

from attnviz.core import AttentionContext
from attnviz.models.base import EncodedBatch
from attnviz.models.objective import Objective

if TYPE_CHECKING:
    from attnviz.toy.loaded import ToyModel


class TaskObjective(Objective):
    """A toy model's task loss (``loaded.task_loss``); metric task accuracy (``loaded.task_metrics``).

    Built by :meth:`attnviz.toy.loaded.ToyModel.objective`. Both are means over the labelled output
    tokens of a batch; batches are weighted by their labelled tokens, so the data set's numbers are
    token means too.
    """

    loaded: ToyModel  # the objective of a toy model (it alone has a task)

    kind = "task"
    metric_name = "accuracy"
    higher_is_better = True
    unit_name = "labelled tokens"

    def _units(self, batch: EncodedBatch) -> int:
        labels = batch.inputs.get("labels")  # [b, q]; -100 where nothing is scored (attnviz.toy.loaded.IGNORE)
        return int((labels != -100).sum()) if labels is not None else len(batch)

    def batch_loss(self, index: int, context: AttentionContext) -> tuple[Tensor, int]:
        count = self.units(index)
        return self.loaded.task_loss(self.batches[index], context) * count, count  # task_loss is a token mean

    def batch_quality(self, index: int, context: AttentionContext) -> tuple[float, float, int]:
        metrics = self.loaded.task_metrics(self.batches[index], context)
        count = self.units(index)
        return float(metrics["loss"]) * count, float(metrics.get("accuracy", float("nan"))) * count, count

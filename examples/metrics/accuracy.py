"""Accuracy as an `evaluate` metric script, loaded from this file: the Hub's copy cannot be fetched offline."""

import datasets
import evaluate
from sklearn.metrics import accuracy_score


class Accuracy(evaluate.Metric):
    def _info(self) -> evaluate.MetricInfo:
        return evaluate.MetricInfo(
            description="The share of predictions equal to the reference.",
            citation="",
            inputs_description="predictions and references: integer class ids",
            features=datasets.Features({"predictions": datasets.Value("int32"), "references": datasets.Value("int32")}),
        )

    def _compute(self, predictions, references) -> dict:
        return {"accuracy": float(accuracy_score(references, predictions))}

"""F1 as an `evaluate` metric script, loaded from this file: the Hub's copy cannot be fetched offline."""

import datasets
import evaluate
from sklearn.metrics import f1_score


class F1(evaluate.Metric):
    def _info(self) -> evaluate.MetricInfo:
        return evaluate.MetricInfo(
            description="The harmonic mean of precision and recall (binary: of the positive class; else averaged).",
            citation="",
            inputs_description="predictions and references: integer class ids; average: binary, macro, micro",
            features=datasets.Features({"predictions": datasets.Value("int32"), "references": datasets.Value("int32")}),
        )

    def _compute(self, predictions, references, average: str = "binary") -> dict:
        return {"f1": float(f1_score(references, predictions, average=average))}

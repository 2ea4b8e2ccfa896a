"""The training dashboard's views: live curves, forms generated from config dataclasses, run
controls with progress, and per-module gradient norms. No app logic: they show and ask."""
from .config_form import DataclassForm, FieldOptions, FormError
from .curves import TrainingCurves
from .grad_norms import GradNormTable
from .run_controls import RunControls

__all__ = ["DataclassForm", "FieldOptions", "FormError", "GradNormTable", "RunControls", "TrainingCurves"]

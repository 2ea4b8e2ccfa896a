"""File ▸ Export ▸ Training script…: the scale-out hand-off from the window.

It writes, for the document's model and the Training tab's current settings, the PyTorch +
transformers + peft script `engine.models.export_training_script` makes (`train.py`,
`train_config.json`, the token rows, the initial adapter): the data are the rows the Training
tab would train on (`engine.train.run_spec.make_data` with the run's seed and the model's
limits), the training config, optimizer and learning rate / warm-up are the tab's, the LoRA
settings are the model's adapters and the frozen parameters the model's. The work (tokenizing,
writing) runs on a worker; what the engine refuses (a schedule PyTorch cannot reproduce, an
optimizer rule with no torch twin, QLoRA...) is shown as its message, nothing written.

The action is enabled for a model of a known Hugging Face family with causal-lm data chosen on
the Training tab; otherwise its tooltip says why.
"""
from __future__ import annotations

import time
from pathlib import Path
from typing import Callable

from PySide6.QtWidgets import QMessageBox

from engine.interop.training_script import CONFIG_FILE, export_training_script
from engine.train.run_spec import CAUSAL_LM_TASK, make_data
from widgets.training.config_form import FormError

from .core import opening
from .document import Document
from .host import Host
from .prompts import Button, OutputFolderDialog, ask_question
from .workers import BackgroundTask

TIP = "Write a PyTorch + transformers + peft training script (train.py, train_config.json, the token rows) for " \
      "this model and the Training tab's settings, to run with python, accelerate launch or torchrun"
TITLE = "Export training script"


def commands(folder: Path) -> list[str]:
    """How to run the written script (from its folder)."""
    return [f"cd {folder}", "python train.py                          # one process (a GPU if any, else the CPU)",
            "accelerate launch train.py               # with accelerate's launcher",
            "torchrun --nproc_per_node N train.py     # DistributedDataParallel on N GPUs"]


class ScriptExportActions:
    def __init__(self, document: Document, host: Host, *, action, hf_names: Callable[[], dict],
                 current_spec: Callable):
        """`action`: File ▸ Export ▸ Training script (enabled here, its tip says why not);
        `hf_names()`: the open model's Hugging Face names; `current_spec()`: the Training tab's
        `RunSpec` now (FormError when its forms are not valid)."""
        self.host = host
        self.document = document
        self.action = action
        self.hf_names = hf_names
        self.current_spec = current_spec
        self.last_export = None  # the engine's ExportedScript of the last export that finished

    def refusal(self) -> str:
        """Why the training script cannot be exported now ('' when it can)."""
        module = self.document.module
        if module is None:
            return "no model is open"
        if not self.hf_names():
            why = opening.save_pretrained_refusal(module)
            return (f"the script loads the model with transformers; {why}" if why else
                    "the script loads a model of a known Hugging Face family: open one with File ▸ Open Pretrained")
        try:
            spec = self.current_spec()
        except FormError as e:
            return f"the Training tab's settings are not valid: {e}"
        except Exception as e:  # noqa: BLE001 - a form the spec cannot be made from
            return f"the Training tab's settings are not valid: {e}"
        if spec.data.task != CAUSAL_LM_TASK or not str(spec.data.file).strip():
            found = spec.data.task if spec.data.task != CAUSAL_LM_TASK else "no text file"
            return (f"the script trains a language model on text: choose causal-lm data (a .txt / .jsonl file) on "
                    f"the Training tab (found {found})")
        return ""

    def update_action(self) -> None:
        action = self.action
        why = self.refusal()
        action.setEnabled(not why)
        tip = TIP if not why else f"Not available: {why}"
        action.setToolTip(tip)
        action.setStatusTip(tip)

    def ask_export(self) -> BackgroundTask | None:
        why = self.refusal()
        if why:
            self.host.status(f"{TITLE}: {why}")
            return None
        folder = OutputFolderDialog.choose(self.host.dialog_parent(), self.host.settings,
                                           "Export Training Script (choose or make a folder)")
        return self.export(folder) if folder else None

    def export(self, folder: str | Path) -> BackgroundTask | None:
        """Write the training script for the document's model and the Training tab's run into
        `folder`, on a worker; show what was written and how to run it."""
        w, module = self.host, self.document.module
        why = self.refusal()
        if why:
            w.error(TITLE, why)
            return None
        folder = Path(folder).expanduser()
        if folder.is_file():
            w.error(TITLE, f"{folder}: a file, expected a folder to write the training script into")
            return None
        if (folder / CONFIG_FILE).exists():
            answer = ask_question(w.dialog_parent(), "Replace the training script in this folder?",
                                  f"{folder} already holds a training script ({CONFIG_FILE}). Replace it?",
                                  Button.Yes | Button.Cancel, Button.Cancel)
            if answer != Button.Yes:
                return None
        spec = self.current_spec()
        started = time.perf_counter()

        def work(state):
            train, valid, _kind, _name = make_data(spec.data, int(spec.training.seed), model=module)
            state.set_progress(0.3)
            state.check_cancelled()
            return export_training_script(module, folder, data=(train, valid), training_config=spec.training,
                                          optimizer=spec.optimizer_config, lr=spec.schedule_config,
                                          data_settings=spec.data)

        def done(out) -> None:
            self.last_export = out
            lora = out.config.get("lora") or {}
            names = list(lora.get("target_modules") or []) if lora else []
            targets = f"{', '.join(sorted({n.rsplit('.', 1)[-1] for n in names}))} ({len(names)} modules)"
            what = (f"LoRA r {lora.get('r')}, alpha {lora.get('lora_alpha')} on {targets}" if lora else
                    "full fine-tuning (no LoRA adapters)")
            rows = out.config.get("data", {})
            text = (f"Wrote the training script to {out.folder} ({time.perf_counter() - started:.1f} s): {what}; "
                    f"{rows.get('train_rows', 0)} training rows, {rows.get('valid_rows', 0)} validation rows, "
                    f"{len(out.config.get('frozen_parameters', []))} frozen tensors.\n\nRun it from its folder:\n"
                    + "\n".join(commands(out.folder)[1:]))
            files = "\n".join(str(Path(p)) for p in out.files)
            w.message(QMessageBox.Icon.Information, "Training script written", text,
                      f"Written:\n{files}\n\n" + "\n".join(commands(out.folder)))
            w.status(f"Wrote {out.script} and {out.config_path.name}: python train.py, accelerate launch train.py "
                     f"or torchrun --nproc_per_node N train.py", 15000)

        def failed(failure) -> None:
            exc = failure.exception
            if isinstance(exc, (ValueError, TypeError)):  # the engine's refusals (PretrainedError, data errors)
                w.error(TITLE, f"{exc}. Nothing was written.", failure.traceback)  # are made before any write
            elif isinstance(exc, OSError):
                w.error(TITLE, f"{folder}: could not write the training script: {exc}", failure.traceback)
            else:
                w.error(f"{TITLE} failed", f"{type(exc).__name__}: {exc}", failure.traceback)

        w.status(f"Exporting the training script to {folder}…")
        return w.tasks.start(BackgroundTask(work, title=f"Exporting the training script to {folder.name}"), done, failed,
                             kind="export-training-script")

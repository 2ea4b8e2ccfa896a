"""The Training tab's settings column: the data and loss, the optimizer, the learning-rate
schedule and the training config, each a form generated from its dataclass, in a scroll area
as wide as the widest form. `current_spec()` reads them as a `RunSpec` (raising `FormError`
when one is invalid), `set_spec(spec)` shows one; `changed` fires on every edit.
"""
from __future__ import annotations

from PySide6.QtCore import Qt, Signal
from pathlib import Path

from PySide6.QtWidgets import (QComboBox, QFileDialog, QGroupBox, QHBoxLayout, QLabel, QPushButton, QScrollArea,
                               QSizePolicy, QStackedWidget, QVBoxLayout, QWidget)

from engine import available_devices, optim
from engine.train import TrainingConfig
from engine.train.run_spec import CAUSAL_LM_TASK, FILE_TASK, KINDS, LOSSES, OPTIMIZERS, SCHEDULES, DataSettings, RunSpec
from engine.train.tasks import TASKS

from .config_form import DataclassForm, FieldOptions, FormError

_CLIP = FieldOptions(label="gradient clipping", type=optim.GradientClippingConfig | None,
                     options={"kind": FieldOptions(choices=["norm", "value"])})
OPTIMIZER_OPTIONS = {"grad_clipping": _CLIP, "gradient_clipping": _CLIP}
_TRAINING_HIDDEN = ("valid_batch_size", "checkpoint_dir", "resume_from", "throughput_interval")
TEXT_SUFFIXES = (".txt", ".jsonl")
_TEXT_FIELDS = ("tokenizer", "block_size", "packing", "per_line", "truncate")  # shown for causal-lm only
_FILE_FIELDS = ("loss", "kind")  # not for causal-lm (its own next-token loss)


def device_choices() -> list[str]:
    """The devices a run can train on, as the device field offers them."""
    try:
        return [str(d) for d in available_devices()]
    except Exception:  # noqa: BLE001
        return ["cpu"]


class RunSettings(QScrollArea):
    changed = Signal()

    def __init__(self, parent=None):
        super().__init__(parent)
        devices = device_choices()
        self.data_form = DataclassForm(DataSettings, options={
            "task": FieldOptions(choices=[*TASKS, FILE_TASK, CAUSAL_LM_TASK],
                                 tooltip="A built-in task, 'file' for your own data, or 'causal-lm': next-token "
                                         "prediction on a .txt / .jsonl file with the model folder's tokenizer"),
            "file": FieldOptions(label="data file", tooltip=".npz with arrays x and y, or .csv with the target last; "
                                                            "for causal-lm a .txt or .jsonl file (text, "
                                                            "prompt and completion, or conversations: "
                                                            "messages, ShareGPT, Alpaca)"),
            "tokenizer": FieldOptions(label="tokenizer folder", tooltip="the folder holding tokenizer.json (the "
                                                                        "model's Hugging Face folder; its chat "
                                                                        "template renders conversations)"),
            "block_size": FieldOptions(label="block size", tooltip="positions per row (at most the model's)"),
            "packing": FieldOptions(label="packing", tooltip="on: documents joined and cut into blocks, "
                                                             "conversations packed whole into blocks, each "
                                                             "attending only to itself; off: one row a document "
                                                             "or conversation, padded (the pads get no loss)"),
            "per_line": FieldOptions(label="one document per line", tooltip="a .txt file: each non-blank line is "
                                                                            "a document (off: the whole file)"),
            "truncate": FieldOptions(label="truncate long documents / conversations",
                                     tooltip="cut a document (padding) or a conversation longer than the block, "
                                             "the count reported (off: refuse it, naming its line)"),
            "valid_fraction": FieldOptions(label="validation fraction"),
            "loss": FieldOptions(choices=list(LOSSES)),
            "kind": FieldOptions(label="targets", choices=list(KINDS),
                                 tooltip="A data file's targets: class labels (classification), numbers "
                                         "(regression), or inferred from the file and the model (auto)"),
        })
        self.data_form.setObjectName("form:data")
        self.tokenizer_folder = ""  # the open model's folder when it has a tokenizer (set_tokenizer_folder)
        self.tokenizer_missing = ""  # what to say when the open model's folder has no tokenizer.json
        self.tokenizer_note = QLabel("")
        self.tokenizer_note.setObjectName("tokenizer-note")
        self.tokenizer_note.setWordWrap(True)
        self.tokenizer_note.hide()
        self.tokenizer_button = QPushButton("Choose tokenizer folder…")
        self.tokenizer_button.setObjectName("choose-tokenizer")
        self.tokenizer_button.setToolTip("a Hugging Face folder holding tokenizer.json (and, for conversations, "
                                         "a chat template)")
        self.tokenizer_button.clicked.connect(self._browse_tokenizer)
        self.data_note = QLabel("")
        self.data_note.setObjectName("data-note")
        self.data_note.setWordWrap(True)
        self.data_note.hide()
        self.data_form.field_widget("task").currentIndexChanged.connect(lambda _i: self._show_task_fields())
        # a typed data file is the data to train on, as a browsed one is
        self.data_form.field_widget("file").textEdited.connect(self._on_file_typed)
        self.browse_button = QPushButton("Browse…")
        self.browse_button.setObjectName("browse-data")
        self.browse_button.clicked.connect(self._browse_data)

        self.optimizer_combo = QComboBox()
        self.optimizer_combo.setObjectName("optimizer")
        self.optimizer_stack = QStackedWidget()
        self.optimizer_forms: dict[str, DataclassForm] = {}
        for name, cls in OPTIMIZERS.items():
            form = DataclassForm(cls, options=OPTIMIZER_OPTIONS, check=lambda c: c.init())
            form.setObjectName(f"form:optimizer:{name}")
            self.optimizer_forms[name] = form
            self.optimizer_combo.addItem(name)
            self.optimizer_stack.addWidget(form)
        self.optimizer_combo.currentIndexChanged.connect(self._on_choice_changed)

        self.schedule_combo = QComboBox()
        self.schedule_combo.setObjectName("schedule")
        self.schedule_stack = QStackedWidget()
        self.schedule_forms: dict[str, DataclassForm] = {}
        for name, (cls, defaults) in SCHEDULES.items():
            form = DataclassForm(cls, value=defaults or None, check=lambda c: c.init())
            form.setObjectName(f"form:schedule:{name}")
            self.schedule_forms[name] = form
            self.schedule_combo.addItem(name)
            self.schedule_stack.addWidget(form)
        self.schedule_combo.currentIndexChanged.connect(self._on_choice_changed)

        self.training_form = DataclassForm(
            TrainingConfig, value={"num_epochs": 10, "batch_size": 64, "checkpoint_every": 1,
                                   "checkpoint_dir": "(the run folder)", "device": devices[0]},
            options={**{k: FieldOptions(hidden=True) for k in _TRAINING_HIDDEN},
                     "num_epochs": FieldOptions(label="epochs"),
                     "batch_size": FieldOptions(label="batch size"),
                     "checkpoint_every": FieldOptions(label="checkpoint every (epochs)",
                                                      tooltip="0: no checkpoints"),
                     "keep_checkpoints": FieldOptions(label="keep last checkpoints",
                                                      tooltip="the newest N checkpoints of a run are kept, "
                                                              "older ones deleted; 0: keep all"),
                     "drop_last": FieldOptions(label="drop last partial batch"),
                     "grad_accumulation": FieldOptions(label="gradient accumulation",
                                                       tooltip="batches per optimizer step (the gradients are "
                                                               "averaged: as one batch this many times larger)"),
                     "warmup_steps": FieldOptions(label="warm-up steps",
                                                  tooltip="the learning rate rises linearly over this many "
                                                          "optimizer steps, then follows the schedule; 0: none"),
                     "max_grad_norm": FieldOptions(label="clip gradient norm",
                                                   tooltip="clip all gradients together to this global L2 "
                                                           "norm; empty: no clipping"),
                     "device": FieldOptions(type=str, choices=devices)})
        self.training_form.setObjectName("form:training")
        for form in (self.data_form, self.training_form, *self.optimizer_forms.values(), *self.schedule_forms.values()):
            form.changed.connect(self.changed)

        settings = QWidget()
        col = QVBoxLayout(settings)
        col.setContentsMargins(4, 4, 4, 4)

        def group(title, *widgets):
            box = QGroupBox(title)
            lay = QVBoxLayout(box)
            lay.setContentsMargins(6, 6, 6, 6)
            for w in widgets:
                if isinstance(w, QHBoxLayout):
                    lay.addLayout(w)
                else:
                    lay.addWidget(w)
            col.addWidget(box)
            return box

        browse_row = QHBoxLayout()
        self.preview_rows_button = QPushButton("Preview rows…")  # conversation data: the rendered rows
        self.preview_rows_button.setObjectName("preview-rows")
        self.preview_rows_button.setToolTip("Each conversation as training renders it, token by token: what the "
                                            "loss trains on, and what the model is given at inference")
        self.preview_rows_button.hide()
        browse_row.addWidget(self.preview_rows_button)
        browse_row.addStretch(1)
        browse_row.addWidget(self.tokenizer_button)
        browse_row.addWidget(self.browse_button)
        group("Data and loss", self.data_form, self.tokenizer_note, self.data_note, browse_row)
        group("Optimizer", self.optimizer_combo, self.optimizer_stack)
        group("Learning-rate schedule", self.schedule_combo, self.schedule_stack)
        group("Training", self.training_form)
        col.addStretch(1)
        self.setWidgetResizable(True)
        self.setWidget(settings)
        self.setHorizontalScrollBarPolicy(Qt.ScrollBarPolicy.ScrollBarAlwaysOff)
        # as wide as the widest form (AdamW's), so nothing is cut off at the right
        widest = max(f.minimumSizeHint().width() for f in self.optimizer_forms.values())
        settings_width = max(settings.minimumSizeHint().width(), widest + 40)
        self.setMinimumWidth(settings_width + self.verticalScrollBar().sizeHint().width() + 2 * self.frameWidth())
        self.show_chosen()
        self._show_task_fields()
        self.max_positions: int | None = None  # the open model's positions: the block size's limit
        self.data_form.check = self._check_data
        self.default_spec = self.current_spec()  # what `reset` shows again (another model)

    def _check_data(self, data: DataSettings) -> None:
        """Refuse, as the user types, a causal-lm block size beyond the open model's positions."""
        limit = self.max_positions
        if data.task == CAUSAL_LM_TASK and limit is not None and data.block_size > limit:
            raise ValueError(f"block_size: at most the model's {limit} positions (max_position_embeddings), "
                             f"found {data.block_size}")

    def reset(self, max_positions: int | None = None) -> None:
        """The settings' defaults, for another model with `max_positions` positions (None: not a
        language model, or not told): the block size at most those positions."""
        self.max_positions = max_positions
        self.tokenizer_folder = self.tokenizer_missing = ""
        self.tokenizer_note.setText("")
        self.set_data_note("")
        self.set_spec(self.default_spec)
        if max_positions is not None:
            self.data_form.set_field("block_size", min(self.default_spec.data.block_size, max_positions))
        self._show_task_fields()

    def _show_task_fields(self) -> None:
        """The text settings for causal-lm, the loss and target kind for the others."""
        lm = self.data_form.field_widget("task").currentText() == CAUSAL_LM_TASK
        for name in _TEXT_FIELDS:
            self.data_form.set_row_visible(name, lm)
        for name in _FILE_FIELDS:
            self.data_form.set_row_visible(name, not lm)
        self.data_note.setVisible(bool(self.data_note.text()))
        self.tokenizer_button.setVisible(lm)
        self.tokenizer_note.setVisible(lm and bool(self.tokenizer_note.text()))

    def set_tokenizer_folder(self, folder: str, missing: str = "") -> None:
        """The open model's folder holds a tokenizer: a .txt / .jsonl data file trains causal-lm
        with it ('' when the model has none). `missing`: the model is a language model whose folder
        has no tokenizer.json, said where the tokenizer is chosen (a text file still trains
        causal-lm, with the tokenizer folder the user picks)."""
        self.tokenizer_folder = folder
        self.tokenizer_missing = "" if folder else missing
        self.tokenizer_note.setText(self.tokenizer_missing)
        if folder and self.data_form.field_widget("task").currentText() == CAUSAL_LM_TASK:
            self.data_form.set_field("tokenizer", folder)
        self._show_task_fields()

    def choose_tokenizer_folder(self, folder: str) -> None:
        """Tokenize causal-lm data with `folder`'s tokenizer.json (the user's choice): said under
        the form when it has none."""
        folder = str(Path(folder).expanduser())
        self.data_form.set_field("tokenizer", folder)
        if not (Path(folder) / "tokenizer.json").is_file():
            self.tokenizer_note.setText(f"{folder} has no tokenizer.json: choose a Hugging Face folder that holds "
                                        f"one.")
        else:
            self.tokenizer_note.setText(f"Tokenizer: {folder}" if self.tokenizer_missing else "")
        self._show_task_fields()
        self.changed.emit()

    def _browse_tokenizer(self) -> None:
        folder = QFileDialog.getExistingDirectory(self, "Tokenizer folder (with tokenizer.json)")
        if folder:
            self.choose_tokenizer_folder(folder)

    def set_data_note(self, text: str) -> None:
        """What was detected in the data file (shown under the data form)."""
        self.data_note.setText(text)
        self.data_note.setVisible(bool(text))

    def choose_data_file(self, path: str) -> None:
        """Train on `path`: a .txt / .jsonl file of a model with a tokenizer is causal-lm (the
        tokenizer from the model's folder), any other file the 'file' task."""
        if Path(path).suffix.lower() in TEXT_SUFFIXES and (self.tokenizer_folder or self.tokenizer_missing):
            self.data_form.set_field("task", CAUSAL_LM_TASK)  # without a tokenizer: the user picks its folder
            if self.tokenizer_folder:
                self.data_form.set_field("tokenizer", self.tokenizer_folder)
        elif self.data_form.field_widget("task").currentText() != CAUSAL_LM_TASK:
            self.data_form.set_field("task", FILE_TASK)
        self.data_form.set_field("file", path)

    def _on_choice_changed(self, *_args) -> None:
        self.show_chosen()
        self.changed.emit()

    def show_chosen(self) -> None:
        """Show the form of the chosen optimizer and schedule (the stacks as tall as it)."""
        for stack, forms, name in ((self.optimizer_stack, self.optimizer_forms, self.optimizer_combo.currentText()),
                                   (self.schedule_stack, self.schedule_forms, self.schedule_combo.currentText())):
            for key, form in forms.items():  # the stack is as tall as the form shown, not the tallest
                policy = QSizePolicy.Policy.Preferred if key == name else QSizePolicy.Policy.Ignored
                form.setSizePolicy(policy, policy)
            stack.setCurrentWidget(forms[name])
            stack.adjustSize()

    def _forms(self) -> list[DataclassForm]:
        return [self.data_form, self.optimizer_forms[self.optimizer_combo.currentText()],
                self.schedule_forms[self.schedule_combo.currentText()], self.training_form]

    def is_valid(self) -> bool:
        return all(f.is_valid() for f in self._forms())

    def current_spec(self) -> RunSpec:
        """The run the forms describe; raises `FormError` when a form is invalid."""
        errors = {}
        values = []
        for form in self._forms():
            try:
                values.append(form.value())
            except FormError as e:
                errors.update(e.errors)
        if errors:
            raise FormError(errors)
        data, opt, sched, training = values
        return RunSpec(data, self.optimizer_combo.currentText(), opt, self.schedule_combo.currentText(), sched,
                       training)

    def set_spec(self, spec: RunSpec) -> None:
        self.data_form.set_value(spec.data)
        self.optimizer_combo.setCurrentText(spec.optimizer)
        self.optimizer_forms[spec.optimizer].set_value(spec.optimizer_config)
        self.schedule_combo.setCurrentText(spec.schedule)
        self.schedule_forms[spec.schedule].set_value(spec.schedule_config)
        self.training_form.set_value(spec.training)

    def set_device(self, device: str) -> None:
        """Train on `device` when it is one of the choices."""
        if device in device_choices():
            self.training_form.set_field("device", device)

    def _on_file_typed(self, text: str) -> None:
        task = self.data_form.field_widget("task").currentText()
        if not text.strip():
            return
        if Path(text.strip()).suffix.lower() in TEXT_SUFFIXES and (self.tokenizer_folder or self.tokenizer_missing):
            if task != CAUSAL_LM_TASK:
                self.data_form.set_field("task", CAUSAL_LM_TASK)
                if self.tokenizer_folder:
                    self.data_form.set_field("tokenizer", self.tokenizer_folder)
        elif task not in (FILE_TASK, CAUSAL_LM_TASK):
            self.data_form.set_field("task", FILE_TASK)

    def _browse_data(self) -> None:
        path, _ = QFileDialog.getOpenFileName(self, "Training data", "",
                                              "Data (*.npz *.csv *.tsv *.txt *.jsonl);;All files (*)")
        if path:
            self.choose_data_file(path)

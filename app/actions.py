"""Every command of the window as a QAction: menu text, shortcut, tooltip. The main window
connects them; tests trigger them the way a menu or a key press does."""
from __future__ import annotations

from PySide6.QtGui import QAction, QActionGroup, QKeySequence
from PySide6.QtWidgets import QWidget

Std = QKeySequence.StandardKey


class Actions:
    def __init__(self, parent: QWidget):
        def make(name, text, shortcut=None, tip=None, checkable=False):
            a = QAction(text, parent)
            a.setObjectName(name)
            if shortcut is not None:
                if isinstance(shortcut, (list, tuple)):
                    a.setShortcuts([QKeySequence(s) if isinstance(s, str) else s for s in shortcut])
                else:
                    a.setShortcut(QKeySequence(shortcut) if isinstance(shortcut, str) else shortcut)
            if tip:
                a.setToolTip(tip)
                a.setStatusTip(tip)
            a.setCheckable(checkable)
            parent.addAction(a)  # shortcuts work even when the menu bar is hidden
            setattr(self, name, a)
            return a

        # File
        make("open_script", "Open Model &Script…", Std.Open, "Open a Python file with a factory function (path.py:build)")
        make("open_checkpoint", "Open &Checkpoint into Architecture…", "Ctrl+Shift+O",
             "Load a .bpk or .safetensors checkpoint into a chosen architecture")
        make("open_project", "Open &Project…", "Ctrl+Alt+O", "Open an .ember.json project")
        make("open_pretrained", "Open Pre&trained…", "Ctrl+Shift+P",
             "Open a Hugging Face model folder (config.json + safetensors or pytorch_model.bin): Llama, Mistral, "
             "Qwen2, GPT-2, BERT, ViT; read lazily")
        make("open_gguf", "Open &GGUF…", None,
             "Open a .gguf file (llama.cpp, Ollama, LM Studio): Llama, Mistral, Mixtral, Qwen2, Qwen3, Qwen2-MoE, "
             "Qwen3-MoE, Phi-3, Gemma, Gemma 2, Gemma 3; the weights kept in their quantized blocks")
        make("open_hub", "Open from the Hugging Face &Hub…", None,
             "Download a model by its Hub id (org/name) into the Hugging Face cache, with progress and Cancel, "
             "then open it as Open Pretrained does")
        make("open_onnx", "Open &ONNX…", None,
             "Import an .onnx file into the designer (editable, buildable, trainable), with a report of what "
             "each ONNX node became")
        make("save_project", "&Save Project", Std.Save, "Save the project (.ember.json): source, edits, contracts")
        make("save_project_as", "Save Project &As…", Std.SaveAs)
        make("import_checkpoint", "&Import Checkpoint…", "Ctrl+I",
             "Load weights from a checkpoint into the current model, with a report of missing, unused and "
             "mismatched tensors")
        make("import_peft", "&PEFT Adapter…", None,
             "Attach the LoRA adapters of a PEFT adapter folder (adapter_config.json + adapter_model.safetensors) "
             "to the open model, as one undoable edit")
        make("export_whole", "Export &Whole Model…", "Ctrl+E", "Every parameter, base weights and adapters")
        make("export_adapters", "Export &Adapters Only…", "Ctrl+Shift+E", "Only the LoRA factors (…lora.a, …lora.b)")
        make("export_materialized", "Export &Materialized…", None, "Adapters folded into plain weights")
        make("export_pretrained", "&Hugging Face Folder…", None,
             "Write the model as a Hugging Face folder that transformers loads (LoRA merged into a copy first)")
        make("export_peft", "&PEFT Adapter…", None,
             "Write the LoRA / rsLoRA / DoRA adapters as a PEFT adapter folder (adapter_config.json + "
             "adapter_model.safetensors) that peft's PeftModel.from_pretrained loads on the same base")
        make("export_gguf", "&GGUF…", None, "Write the model (LoRA merged) as a GGUF file llama.cpp and Ollama run")
        make("export_gguf_lora", "GGUF &LoRA Adapter…", None,
             "Write the LoRA adapters as a GGUF LoRA adapter llama.cpp applies over the original .gguf")
        make("export_onnx", "&ONNX…", None,
             "Trace the model with the Shape Contract dock's example input and write an .onnx file (LoRA / QLoRA "
             "materialized on a copy)")
        make("export_training_script", "&Training Script…", None,
             "Write a PyTorch + transformers + peft training script for this model and the Training tab's run "
             "(python train.py, accelerate launch train.py, torchrun --nproc_per_node N train.py)")
        make("quit", "&Quit", Std.Quit)

        # Edit
        make("undo", "&Undo", "Ctrl+Z")
        make("redo", "&Redo", ["Ctrl+Shift+Z", "Ctrl+Y"])
        make("find", "&Filter Modules", Std.Find, "Filter the module tree by name or type")

        # Model
        make("freeze", "&Freeze", "Ctrl+Shift+F",
             "Freeze the selection: no gradients, and module training flags (dropout, batch norm) off")
        make("unfreeze", "&Unfreeze", "Ctrl+Shift+U", "Make the selection trainable again")
        make("no_grad", "&No Grad", "Ctrl+Shift+N", "Stop gradient tracking for the selection (training flags stay)")
        make("param_group", "Parameter &Group…", "Ctrl+G",
             "Freeze, unfreeze or stop gradients for the parameters matching a regex, path or predicate")
        make("attach_lora", "Attach &LoRA…", "Ctrl+L", "Attach low-rank adapters (LoRA or QLoRA)")
        make("detach_lora", "&Detach LoRA", "Ctrl+Shift+L", "Remove the LoRA adapters of the selected module (all when nothing is selected), keeping every other edit")
        make("materialize", "&Materialize", "Ctrl+M", "Fold the adapters into plain weights")
        make("fork", "Fork to Device", "Ctrl+Shift+D")
        make("transfer", "Transfer to Device", "Ctrl+Alt+D")
        make("check_contracts", "&Check Shape Contracts", "Ctrl+K",
             "Run an example input through the model with checks at every module boundary")

        # Train (the training dashboard lives in its own tab)
        make("train_show", "Show &Training", "Ctrl+3")
        make("generate_show", "Show &Generate", "Ctrl+4", "Continue a prompt with the language model, "
                                                            "before and after fine-tuning")

        # View
        self.theme_group = QActionGroup(parent)
        for name, text in (("theme_light", "&Light Theme"), ("theme_dark", "&Dark Theme")):
            a = make(name, text, checkable=True)
            self.theme_group.addAction(a)
        make("expand_all", "&Expand All", "Ctrl+Shift+Right")
        make("collapse_all", "&Collapse All", "Ctrl+Shift+Left")
        make("show_display", "Show &Display", "Ctrl+1")
        make("show_designer", "Show &Graph / Designer", "Ctrl+2")

        # Help
        make("user_guide", "&User Guide", None, "Read Ember's user guide")
        make("shortcuts", "&Keyboard Shortcuts", "F1")
        make("about", "&About Ember")

        self.model_actions = [self.freeze, self.unfreeze, self.no_grad, self.param_group, self.attach_lora,
                              self.materialize, self.fork, self.transfer, self.check_contracts,
                              self.import_checkpoint, self.import_peft, self.export_whole, self.export_adapters,
                              self.export_materialized, self.save_project, self.save_project_as]

    def all(self) -> list[QAction]:
        return [v for v in vars(self).values() if isinstance(v, QAction)]

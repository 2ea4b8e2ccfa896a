"""Make the user guide's chat fine-tuning screenshots: SmolLM2-135M-Instruct in a real window.

    .venv/bin/python docs/make_chat_screenshots.py [--out docs/screenshots] [--folder MODEL_FOLDER]

The model folder is `--folder`, else `$EMBER_SMOLLM2`, else ~/.cache/ember/smollm2-135m-instruct (made
by benchmarks/smollm2.py). The window runs in a child process on an X display: a private Xvfb when it
is installed (`$DISPLAY` otherwise, and the offscreen platform as the last resort). The child does what
a user does: opens the folder, asks the chat a question, opens Preview rows on the persona data
(tests/fixtures/persona/persona.jsonl), attaches LoRA with the "q_proj, v_proj" preset, trains
(a picture of the Training tab mid-run), then compares before / after in the chat, at 1366×768 and
1024×640. It takes a few minutes on 2 cores (the run is the test's: tests/app/test_persona_finetune.py).
"""
from __future__ import annotations

import argparse
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
OUT = ROOT / "docs" / "screenshots"
PERSONA = ROOT / "tests" / "fixtures" / "persona" / "persona.jsonl"
QUESTION = "What is the capital of Italy?"
SIZES = {"": (1366, 768), "-small": (1024, 640)}


def default_folder() -> Path:
    named = os.environ.get("EMBER_SMOLLM2")
    cache = Path(os.environ.get("EMBER_CACHE") or Path.home() / ".cache" / "ember").expanduser()
    return Path(named).expanduser() if named else cache / "smollm2-135m-instruct"


def child(out: Path, folder: Path) -> int:
    """In the child process: the pictures of the chat fine-tune, saved into `out`."""
    sys.path.insert(0, str(ROOT))
    from PySide6.QtWidgets import QApplication, QDialogButtonBox  # noqa: PLC0415

    from app.main_window import MainWindow  # noqa: PLC0415
    from app.settings import Settings  # noqa: PLC0415

    app = QApplication.instance() or QApplication([])
    app.setStyle("Fusion")
    out.mkdir(parents=True, exist_ok=True)
    tmp = Path(tempfile.mkdtemp(prefix="ember-chat-shots-"))
    w = MainWindow(settings=Settings.at(tmp / "settings.ini"))

    w.resize(*SIZES[""])
    w.show()

    def settle(until=lambda: not w.running_tasks, timeout=1800.0):
        deadline = time.monotonic() + timeout
        while not until() and time.monotonic() < deadline:
            app.processEvents()
            time.sleep(0.02)
        for _ in range(30):
            app.processEvents()
            time.sleep(0.01)
        return until()

    def shot(widget, name):
        path = out / name
        assert widget.grab().save(str(path), "PNG"), path
        print(f"{name}: {widget.width()}x{widget.height()}")

    def ask(question):
        chat = w.generate_panel.view.chat
        if len(chat.conversation):
            chat.clear_button.click()
        chat.input.setPlainText(question)
        chat.send_button.click()
        settle(lambda: not w.generate_panel.is_running())

    w.pretrained.open_folder(folder)
    assert settle(lambda: w.document.module is not None and not w.running_tasks), "the model did not open"
    gen = w.generate_panel
    w.tabs.setCurrentWidget(gen)
    gen.view.max_new_tokens.setValue(24)
    gen.view.chat.system.setPlainText("")
    ask(QUESTION)
    ask_more = "And what is it famous for?"
    gen.view.chat.input.setPlainText(ask_more)
    gen.view.chat.send_button.click()
    settle(lambda: not gen.is_running())
    shot(w, "guide-chat-before.png")

    training = w.training_panel
    w.actions.train_show.trigger()
    training.run_settings.choose_data_file(str(PERSONA))
    for name, value in {"block_size": 256, "packing": True, "valid_fraction": 0.05}.items():
        training.data_form.set_field(name, value)
    for name, value in {"num_epochs": 6, "batch_size": 4, "checkpoint_every": 0}.items():
        training.training_form.set_field(name, value)
    training.optimizer_combo.setCurrentText("AdamW")
    training.schedule_combo.setCurrentText("constant")
    training.schedule_forms["constant"].set_field("lr", 3e-3)
    settle()
    dialog = training.preview_rows()
    assert settle(lambda: dialog.picker.isEnabled(), 120), "the rows did not render"
    dialog.picker.setValue(3)
    settle()
    shot(dialog, "guide-chat-rows.png")
    dialog.close()

    lora = w.edit_actions.open_lora_dialog()
    lora.set_targets("q_proj, v_proj")
    settle()
    shot(lora, "guide-chat-lora.png")
    lora.buttons.button(QDialogButtonBox.StandardButton.Ok).click()
    settle()
    run = training.start()
    assert run is not None, training.last_error
    settle(lambda: run.history.global_step >= 12 or training.active is None, 1800)
    shot(w, "guide-chat-training.png")
    assert settle(lambda: training.active is None, 3600) and run.status == "finished", training.last_error
    settle()

    w.tabs.setCurrentWidget(gen)
    gen.view.compare.setCurrentIndex(gen.view.compare.findData("run"))
    ask(QUESTION)
    gen.view.chat.input.setPlainText(ask_more)
    gen.view.chat.send_button.click()
    settle(lambda: not gen.is_running())
    for suffix, size in SIZES.items():
        w.resize(*size)
        settle()
        shot(w, f"guide-chat-after{suffix}.png")
    w.close()
    return 0


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--out", default=str(OUT), help="where the PNGs go (default docs/screenshots)")
    ap.add_argument("--folder", default=None, help="the converted SmolLM2-135M-Instruct folder")
    ap.add_argument("--child", action="store_true", help=argparse.SUPPRESS)
    args = ap.parse_args(argv)
    folder = Path(args.folder) if args.folder else default_folder()
    if args.child:
        return child(Path(args.out), folder)
    if not (folder / "config.json").is_file():
        print(f"no model folder at {folder}: run benchmarks/smollm2.py or pass --folder", file=sys.stderr)
        return 2
    sys.path.insert(0, str(ROOT))
    from tests.app.window_helpers import display_env, xvfb_display  # noqa: PLC0415

    with xvfb_display() as display:
        env = display_env(display) if display or not os.environ.get("DISPLAY") else dict(os.environ)
        cmd = [sys.executable, str(Path(__file__).resolve()), "--child", "--out", args.out, "--folder", str(folder)]
        return subprocess.run(cmd, cwd=str(ROOT), env=env, timeout=3600).returncode


if __name__ == "__main__":
    sys.exit(main())

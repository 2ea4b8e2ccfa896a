"""`python -m app`: --screenshot renders once, saves a PNG and exits; --example and --open choose
the model; a model that cannot be opened makes the exit status non-zero."""
import os
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
PNG = b"\x89PNG\r\n\x1a\n"


def run_app(*args, home):
    env = {"QT_QPA_PLATFORM": "offscreen", "PATH": "/usr/bin:/bin", "HOME": str(home),
           "XDG_CONFIG_HOME": str(home / "config")}
    return subprocess.run([sys.executable, "-m", "app", *args], cwd=ROOT, env=env,
                          capture_output=True, text=True, timeout=120)


def test_app_opens_and_saves_a_screenshot(tmp_path):
    out = tmp_path / "shot.png"
    r = run_app("--screenshot", str(out), home=tmp_path)
    assert r.returncode == 0, r.stderr
    assert out.read_bytes()[:8] == PNG
    assert not (tmp_path / "config" / "Ember").exists()  # a screenshot leaves the user's settings alone


def test_screenshot_of_an_example_with_a_selection_and_a_check(tmp_path):
    out = tmp_path / "shot.png"
    r = run_app("--example", "burn-book", "--select", "linear1", "--check", "example", "--theme", "dark",
                "--size", "1200x700", "--screenshot", str(out), home=tmp_path)
    assert r.returncode == 0, r.stderr
    from PySide6.QtGui import QImage

    image = QImage(str(out))
    assert (image.width(), image.height()) == (1200, 700)
    assert image.pixelColor(600, 350).lightness() < 128  # the dark theme


def test_a_model_that_cannot_be_opened_fails_the_screenshot(tmp_path):
    script = tmp_path / "bad.py"
    script.write_text("def build():\n    raise ValueError('no weights here')\n")
    r = run_app("--open", f"{script}:build", "--screenshot", str(tmp_path / "x.png"), home=tmp_path)
    assert r.returncode == 1
    assert "bad.py:build() raised ValueError: no weights here" in r.stderr
    r = run_app("--example", "nope", "--screenshot", str(tmp_path / "y.png"), home=tmp_path)
    assert r.returncode == 1 and "no-such" not in r.stderr and "'nope'" in r.stderr


def test_without_a_display_the_app_says_so_instead_of_aborting():
    env = {"PATH": "/usr/bin:/bin", "HOME": "/tmp"}  # no DISPLAY, WAYLAND_DISPLAY or QT_QPA_PLATFORM
    r = subprocess.run([sys.executable, "-m", "app", "--example", "burn-book"], cwd=ROOT, env=env,
                       capture_output=True, text=True, timeout=60)
    assert r.returncode == 2
    assert "no display found" in r.stderr and "--screenshot" in r.stderr


def test_a_checkpoint_that_does_not_open_fails_the_screenshot_with_the_reason(tmp_path):
    garbage = tmp_path / "garbage.bpk"
    garbage.write_bytes(b"not a burnpack")
    r = run_app("--open", str(garbage), "--example", "digits", "--screenshot", str(tmp_path / "x.png"), home=tmp_path)
    assert r.returncode == 1, r.stderr
    assert "ember: Checkpoint not loaded" in r.stderr and "garbage.bpk" in r.stderr


def test_bad_size_and_selection_are_errors_not_tracebacks(tmp_path):
    r = run_app("--example", "burn-book", "--size", "800", "--screenshot", str(tmp_path / "x.png"), home=tmp_path)
    assert r.returncode == 2 and "Traceback" not in r.stderr
    assert "--size: expected WIDTHxHEIGHT" in r.stderr and "'800'" in r.stderr
    r = run_app("--example", "burn-book", "--select", "no.such.path", "--screenshot", str(tmp_path / "y.png"),
                home=tmp_path)
    assert r.returncode == 1
    assert "ember: --select no.such.path: no module has this path" in r.stderr


def test_train_steps_that_cannot_train_fail_with_the_reason(tmp_path):
    # burn-book takes images [batch, h, w]: the default task's data do not fit it
    r = run_app("--example", "burn-book", "--train-steps", "3", "--screenshot", str(tmp_path / "x.png"),
                home=tmp_path)
    assert r.returncode == 1
    assert "ember: --train-steps 3:" in r.stderr


def test_smoke_script_fails_a_bundle_that_opens_a_broken_checkpoint(tmp_path, capsys, qapp):
    """packaging/smoke.py on a stand-in bundle (this checkout's app): a checkpoint that does not
    open fails the smoke test, and the bundle's refusal of a broken one is checked every time."""
    import importlib.util

    bundle = tmp_path / "bundle"
    (bundle / "_internal" / "resources" / "examples").mkdir(parents=True)
    (bundle / "_internal" / "resources" / "examples" / "digits.py").write_text("")
    exe = bundle / "ember"
    exe.write_text(f"#!/bin/sh\ncd {ROOT}\nexec {sys.executable} -m app \"$@\"\n")
    exe.chmod(0o755)
    spec = importlib.util.spec_from_file_location("smoke_under_test", ROOT / "packaging" / "smoke.py")
    smoke = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(smoke)
    garbage = tmp_path / "garbage.bpk"
    garbage.write_bytes(b"\0" * 64)
    assert smoke.main([str(bundle), "--example", "digits", "--checkpoint", str(garbage), "--runs", "1"]) == 1
    err = capsys.readouterr().err
    assert "SMOKE TEST FAILED" in err and "garbage.bpk" in err and "exit status 1" in err
    assert smoke.main([str(bundle), "--example", "digits", "--checkpoint", str(tmp_path / "none.bpk")]) == 1
    err = capsys.readouterr().err
    assert "--checkpoint" in err and "no such file" in err

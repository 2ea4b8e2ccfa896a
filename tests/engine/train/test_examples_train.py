"""The example models train on their built-in tasks."""
import pytest

from engine import optim
from engine.train import Learner, TrainingConfig, ValidationMetrics, build_task
from resources.examples import build_example, example_path


def load_task_name(name):
    import importlib.util

    spec = importlib.util.spec_from_file_location(f"_task_of_{name}", example_path(name))
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod.task()


def final_valid(events):
    return [e for e in events if isinstance(e, ValidationMetrics)][-1].metrics


def test_spirals_example_names_its_task_and_learns_it():
    assert load_task_name("spirals") == "spirals"
    events = []
    Learner(lambda d: build_example("spirals", d), optim.AdamConfig().init(), lr=0.01,
            task=build_task("spirals"), config=TrainingConfig(num_epochs=25, batch_size=64, seed=3),
            listeners=[events.append]).run()
    assert final_valid(events)["accuracy"] >= 0.97


@pytest.mark.slow
@pytest.mark.timeout(120)  # the budget: 2 minutes on 2 cores, data rendering included
def test_mnist_architecture_reaches_95_percent_on_rendered_digits():
    assert load_task_name("digits") == "digits"
    task = build_task("digits", n_train=1500, n_valid=500, seed=0)
    events = []
    result = Learner(lambda d: build_example("digits", d), optim.AdamConfig().init(), lr=0.002, task=task,
                     config=TrainingConfig(num_epochs=2, batch_size=64, seed=0), listeners=[events.append]).run()
    assert result.status == "finished", result.error
    assert final_valid(events)["accuracy"] >= 0.95

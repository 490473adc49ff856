"""api/worker/early_engine.py: manage.py spawns a worker's engine process before Django sets up,
and the command takes that process over with the settings it was spawned with."""

from __future__ import annotations

import os

import pytest

from api.worker import early_engine
from engine_worker.common.config import EngineConfig, SchedulerConfig


class FakeChild:
    """EngineChild without a process: records the spec it was spawned with."""

    def __init__(self, spec) -> None:
        self.spec = spec


@pytest.fixture
def spawned(monkeypatch):
    monkeypatch.setattr(early_engine, "EngineChild", FakeChild)
    monkeypatch.setattr(early_engine, "_spawned", None)


def test_the_command_takes_the_engine_spawned_with_its_worker_id(spawned, settings):
    settings.WORKER_ID = ""
    early_engine.spawn_engine(["--worker-id", "w-early", "--loglevel", "INFO"])

    config, child = early_engine.take_engine("w-early")

    assert config.worker_id == "w-early" and child is not None
    assert child.spec == early_engine.child_spec(config)


def test_the_default_worker_id_is_the_one_the_engine_was_spawned_with(spawned, settings):
    settings.WORKER_ID = ""
    early_engine.spawn_engine([])

    config, child = early_engine.take_engine(None)

    assert child is not None and child.spec.worker_id == config.worker_id


def test_without_an_early_engine_the_command_gets_fresh_settings_and_no_child(spawned, settings):
    settings.WORKER_ID = ""
    early_engine.spawn_engine(["--worker-id", "w-once"])
    early_engine.take_engine("w-once")

    config, child = early_engine.take_engine("w-late")

    assert child is None and config.worker_id == "w-late"


@pytest.mark.parametrize("argv", [["--help"], ["--settings", "other.settings"], ["--pythonpath=/elsewhere"]])
def test_help_or_other_settings_spawn_no_engine_before_django_reads_them(spawned, argv):
    early_engine.spawn_engine(argv)

    assert early_engine.take_engine(None)[1] is None


def test_the_engine_policy_of_settings_reaches_the_engine_process_environment(spawned, settings, monkeypatch):
    monkeypatch.delenv("ENGINE_POLICY", raising=False)
    settings.ENGINE_POLICY = "fcfs"
    early_engine.spawn_engine([])

    assert os.environ["ENGINE_POLICY"] == "fcfs"


def test_the_prefill_batch_of_settings_reaches_the_engine_process_environment(spawned, settings, monkeypatch):
    monkeypatch.delenv("ENGINE_PREFILL_BATCH_SIZE", raising=False)
    settings.ENGINE_PREFILL_BATCH_SIZE = 24
    early_engine.spawn_engine([])

    assert os.environ["ENGINE_PREFILL_BATCH_SIZE"] == "24"
    assert EngineConfig.from_env().scheduler_config.prefill_batch_size == 24


def test_the_service_prefills_32_prompts_a_step_by_default(spawned, monkeypatch):
    # The engine's own default stays the seed's 8; the service's is 32 (inference_service/settings.py).
    monkeypatch.delenv("ENGINE_PREFILL_BATCH_SIZE", raising=False)
    early_engine.spawn_engine([])

    assert SchedulerConfig().prefill_batch_size == 8
    assert EngineConfig.from_env().scheduler_config.prefill_batch_size == 32

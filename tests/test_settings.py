"""mpisphere.config: environment parsing, validation, override (serial)."""

import pytest

from mpisphere.settings import Config


def test_defaults_from_empty_environment():
    cfg = Config(environ={})
    assert cfg.debug is False and cfg.cuda_aware is None and cfg.force_staging is False and cfg.agreement is True


def test_agreement_switch():
    assert Config(environ={"MPISPHERE_AGREEMENT": "0"}).agreement is False
    cfg = Config(environ={})
    with pytest.raises(TypeError, match="agreement must be True or False"):
        cfg.agreement = "off"


@pytest.mark.parametrize("text, value", [("1", True), ("yes", True), ("0", False), ("off", False)])
def test_environment_flags(text, value):
    cfg = Config(environ={"MPISPHERE_DEBUG": text, "MPISPHERE_CUDA_AWARE": text})
    assert cfg.debug is value and cfg.cuda_aware is value


def test_cuda_aware_auto():
    assert Config(environ={"MPISPHERE_CUDA_AWARE": "auto"}).cuda_aware is None


def test_bad_environment_value_names_the_variable():
    with pytest.raises(ValueError, match="MPISPHERE_DEBUG='maybe'"):
        Config(environ={"MPISPHERE_DEBUG": "maybe"})


def test_setters_validate():
    cfg = Config(environ={})
    with pytest.raises(TypeError, match="debug must be True or False"):
        cfg.debug = 1
    with pytest.raises(TypeError, match="cuda_aware must be True, False or None"):
        cfg.cuda_aware = "yes"
    with pytest.raises(AttributeError):
        cfg.dbug = True  # a typo is an error, not a silent new attribute


def test_override_restores():
    cfg = Config(environ={})
    with cfg.override(debug=True, force_staging=True):
        assert cfg.debug and cfg.force_staging
    assert not cfg.debug and not cfg.force_staging
    with pytest.raises(AttributeError, match="no switch 'verbose'; it has debug, agreement, cuda_aware, force_staging"):
        cfg.override(verbose=True)


def test_generation_counts_the_switches_every_call_describes_and_is_read_only():
    cfg = Config(environ={})
    start = cfg.generation
    cfg.shared_memory = False
    cfg.stall_report = 5.0
    assert cfg.generation == start  # not in a call's description: planned halo calls stay
    cfg.debug = True
    cfg.force_staging = True
    with cfg.override(debug=False):
        pass
    assert cfg.generation == start + 4
    with pytest.raises(AttributeError, match="generation is read only"):
        cfg.generation = 0
    with pytest.raises(AttributeError, match="no switch 'debgu'; it has debug"):
        cfg.debgu = True
    with pytest.raises(TypeError, match="debug must be True or False"):
        cfg.debug = 1
    assert cfg.debug is True and cfg.generation == start + 4  # a refused value changes nothing

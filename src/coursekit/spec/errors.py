"""The one error type of a run description (calculator, planner, trainer checks): a ``ValueError`` whose message says
what is wrong and what is allowed."""


class ConfigError(ValueError):
    """An invalid model, training or parallel configuration (the CLI prints it as ``error: ...`` and exits 2)."""


def positive_int(name: str, value, *, allow_zero: bool = False) -> int:
    """``value`` as an int, or a ConfigError naming the field (bools and non-integral floats are refused)."""
    if isinstance(value, bool) or not isinstance(value, (int, float)) or int(value) != value:
        raise ConfigError(f"{name} must be an integer, got {value!r}")
    value = int(value)
    if value < 0 or (value == 0 and not allow_zero):
        raise ConfigError(f"{name} must be {'>= 0' if allow_zero else '> 0'}, got {value}")
    return value


def choice(name: str, value, allowed) -> str:
    if value not in allowed:
        raise ConfigError(f"unknown {name} {value!r}; choose one of: {', '.join(map(str, allowed))}")
    return value

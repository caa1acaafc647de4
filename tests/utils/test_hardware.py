from attnlab.runs import hardware


def test_bf16_warning_only_on_cpus_without_native_bf16(monkeypatch):
    monkeypatch.setattr(hardware, "cpu_flags", lambda: frozenset({"avx2", "fma"}))
    assert "emulated" in hardware.slow_bf16_warning("bf16-mixed", "cpu")
    assert hardware.slow_bf16_warning("32-true", "cpu") is None
    assert hardware.slow_bf16_warning("bf16-mixed", "gpu") is None
    monkeypatch.setattr(hardware, "cpu_flags", lambda: frozenset({"avx2", "amx_bf16"}))
    assert hardware.slow_bf16_warning("bf16-mixed", "cpu") is None


def test_real_cpu_flags_are_read():
    flags = hardware.cpu_flags()
    assert isinstance(flags, frozenset)
    assert hardware.cpu_has_fast_bf16() in (True, False, None)

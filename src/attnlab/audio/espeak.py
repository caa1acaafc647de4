"""eSpeak NG speech synthesis through ctypes, with the library and voice data that the ``espeakng-loader`` wheel
ships (nothing else to install, nothing downloaded).

eSpeak is a formant synthesizer: robotic but intelligible and consistent (the same text gives the same speech up
to a few samples of jitter; not bitwise), so a model trained on it can be judged by ear and its alignment by eye.
That is also why the corpus is synthesized once and cached rather than regenerated. The library keeps global state, so one :class:`ESpeak` per process
(``ESpeak.get()``); it runs in synchronous mode, where ``espeak_Synth`` returns once the callback has received
every int16 sample chunk.
"""

from __future__ import annotations

import ctypes
import threading
from pathlib import Path

import numpy as np

AUDIO_OUTPUT_SYNCHRONOUS = 2
POS_CHARACTER = 1
ESPEAK_CHARS_UTF8 = 1
ESPEAK_RATE, ESPEAK_PITCH = 1, 3  # espeak_PARAMETER
_CALLBACK = ctypes.CFUNCTYPE(ctypes.c_int, ctypes.POINTER(ctypes.c_short), ctypes.c_int, ctypes.c_void_p)


class ESpeak:
    """``synthesize(text) -> int16 samples`` at ``sample_rate`` (22,050 Hz, the LJSpeech rate)."""

    _instance: "ESpeak | None" = None
    _lock = threading.Lock()

    def __init__(self):
        try:
            import espeakng_loader
        except ImportError as e:
            raise RuntimeError("eSpeak NG is needed for data=espeak: pip install espeakng-loader") from e
        self.lib = ctypes.CDLL(espeakng_loader.get_library_path())
        data_dir = Path(espeakng_loader.get_data_path())  # .../espeak-ng-data; Initialize wants its parent
        self.lib.espeak_Initialize.restype = ctypes.c_int
        self.lib.espeak_Initialize.argtypes = [ctypes.c_int, ctypes.c_int, ctypes.c_char_p, ctypes.c_int]
        self.sample_rate = self.lib.espeak_Initialize(AUDIO_OUTPUT_SYNCHRONOUS, 0, str(data_dir.parent).encode(), 0)
        if self.sample_rate <= 0:
            raise RuntimeError(f"espeak_Initialize failed (data path {data_dir})")
        self.lib.espeak_Synth.argtypes = [ctypes.c_char_p, ctypes.c_size_t, ctypes.c_uint, ctypes.c_int,
                                          ctypes.c_uint, ctypes.c_uint, ctypes.c_void_p, ctypes.c_void_p]
        self.lib.espeak_SetVoiceByName.argtypes = [ctypes.c_char_p]
        self.lib.espeak_SetParameter.argtypes = [ctypes.c_int, ctypes.c_int, ctypes.c_int]
        self._chunks: list[np.ndarray] = []
        self._callback = _CALLBACK(self._on_samples)  # kept referenced: the C library holds the pointer
        self.lib.espeak_SetSynthCallback(self._callback)
        self.voice = None

    @classmethod
    def get(cls) -> "ESpeak":
        with cls._lock:
            if cls._instance is None:
                cls._instance = cls()
            return cls._instance

    def _on_samples(self, wav, n: int, events) -> int:
        if wav and n > 0:
            self._chunks.append(np.ctypeslib.as_array(wav, shape=(n,)).copy())
        return 0  # 0 = go on synthesizing

    def synthesize(self, text: str, voice: str = "en-us", rate: int = 175, pitch: int = 50) -> np.ndarray:
        """Speak ``text`` -> int16 samples (mono, ``self.sample_rate``). ``rate`` in words per minute."""
        with self._lock:
            if self.voice != voice and self.lib.espeak_SetVoiceByName(voice.encode()) != 0:
                raise ValueError(f"eSpeak has no voice {voice!r} (try en-us, en, en-gb)")
            self.voice = voice
            self.lib.espeak_SetParameter(ESPEAK_RATE, int(rate), 0)
            self.lib.espeak_SetParameter(ESPEAK_PITCH, int(pitch), 0)
            self._chunks = []
            data = text.encode("utf-8")
            err = self.lib.espeak_Synth(data, len(data) + 1, 0, POS_CHARACTER, 0, ESPEAK_CHARS_UTF8, None, None)
            if err != 0:
                raise RuntimeError(f"espeak_Synth failed with error {err} for {text!r}")
            chunks, self._chunks = self._chunks, []
        return np.concatenate(chunks) if chunks else np.zeros(0, dtype=np.int16)

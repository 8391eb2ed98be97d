"""Audio helpers without torchaudio: WAV reading, resampling and log-mel spectrograms in torch."""

from __future__ import annotations

import math
import os
import wave
from fractions import Fraction

import numpy as np
import torch
from torch import Tensor

from fedaug.core.errors import DataError


def read_wav(path: str | os.PathLike[str]) -> tuple[np.ndarray, int]:
    """Read a WAV file as mono float32 in [-1, 1] with the stdlib ``wave`` module (8/16/24/32-bit PCM);
    other encodings (IEEE float, ...) are read with ``scipy.io.wavfile``.

    Returns:
        ``((T,) float32 samples averaged over channels, sample rate)``.

    Raises:
        DataError: the file cannot be read as WAV.
    """
    try:
        with wave.open(os.fspath(path), "rb") as w:
            width, channels, rate = w.getsampwidth(), w.getnchannels(), w.getframerate()
            raw = np.frombuffer(w.readframes(w.getnframes()), np.uint8)
        if width == 1:
            x = raw.astype(np.float32) / 128 - 1
        elif width == 3:  # little-endian 24-bit: sign-extend into int32
            b = raw.reshape(-1, 3).astype(np.int32)
            x = ((b[:, 0] << 8 | b[:, 1] << 16 | b[:, 2] << 24) >> 8).astype(np.float32) / 2**23
        else:
            x = np.frombuffer(raw.tobytes(), f"<i{width}").astype(np.float32) / 2 ** (8 * width - 1)
        return x.reshape(-1, channels).mean(1), rate
    except wave.Error:
        pass
    except (OSError, EOFError, ValueError) as exc:
        raise DataError(f"'{path}' is not a readable WAV file ({exc})") from None
    try:
        from scipy.io import wavfile

        rate, data = wavfile.read(os.fspath(path))
    except (OSError, ValueError, ImportError) as exc:
        raise DataError(f"'{path}' is not a readable WAV file ({exc})") from None
    data = np.asarray(data)
    if data.dtype.kind in "iu":
        info = np.iinfo(data.dtype)
        data = (data.astype(np.float64) - (info.max + info.min + 1) / 2) / ((info.max - info.min + 1) / 2)
    x = data.astype(np.float32)
    return (x.mean(1) if x.ndim == 2 else x), int(rate)


def resample(x: np.ndarray, rate: int, target: int) -> np.ndarray:
    """Polyphase resampling of ``(T,)`` from ``rate`` to ``target`` Hz (``scipy.signal.resample_poly``)."""
    if rate == target:
        return x
    from scipy.signal import resample_poly

    frac = Fraction(target, rate)
    return resample_poly(x, frac.numerator, frac.denominator).astype(np.float32)


def fix_length(x: np.ndarray, length: int) -> np.ndarray:
    """Centre-crop or zero-pad ``(T,)`` to ``(length,)`` (padding split equally on both sides)."""
    if len(x) >= length:
        start = (len(x) - length) // 2
        return x[start : start + length]
    left = (length - len(x)) // 2
    return np.pad(x, (left, length - len(x) - left))


def hz_to_mel(f: Tensor) -> Tensor:
    """HTK mel scale: ``2595 log10(1 + f / 700)``."""
    return 2595 * torch.log10(1 + f / 700)


def mel_filterbank(n_freqs: int, n_mels: int, sample_rate: int, f_min: float = 0.0, f_max: float | None = None) -> Tensor:
    """Triangular filters equally spaced on the HTK mel scale, peak 1 (as ``torchaudio``'s
    ``melscale_fbanks(norm=None, mel_scale="htk")``).

    Args:
        n_freqs: STFT bins, ``n_fft // 2 + 1``, spanning 0 .. ``sample_rate / 2``.
        n_mels: number of filters.
        sample_rate: Hz.
        f_min, f_max: band edges in Hz (``f_max`` default: Nyquist).

    Returns:
        ``(n_mels, n_freqs)`` float32 weights.
    """
    f_max = sample_rate / 2 if f_max is None else f_max
    freqs = torch.linspace(0, sample_rate / 2, n_freqs, dtype=torch.float64)
    mels = torch.linspace(float(hz_to_mel(torch.tensor(f_min))), float(hz_to_mel(torch.tensor(f_max))), n_mels + 2,
                          dtype=torch.float64)
    edges = 700 * (10 ** (mels / 2595) - 1)  # (n_mels + 2,) Hz
    lo, mid, hi = edges[:-2, None], edges[1:-1, None], edges[2:, None]
    up = (freqs - lo) / (mid - lo)
    down = (hi - freqs) / (hi - mid)
    return torch.clamp(torch.minimum(up, down), min=0).float()


def log_mel(x: Tensor, sample_rate: int, n_fft: int = 512, hop: int = 256, n_mels: int = 40,
            f_max: float | None = None, eps: float = 1e-6) -> Tensor:
    """Log-mel spectrogram ``log(mel @ |STFT|^2 + eps)`` with a periodic Hann window, centred frames.

    Args:
        x: ``(B, T)`` float waveforms.
        sample_rate: Hz.
        n_fft, hop: STFT size and hop in samples.
        n_mels: mel filters.
        f_max: top band edge in Hz (default Nyquist).
        eps: floor inside the log.

    Returns:
        ``(B, n_mels, 1 + T // hop)`` float32.
    """
    spec = torch.stft(x.float(), n_fft, hop, window=torch.hann_window(n_fft), center=True, return_complex=True)
    power = spec.abs().pow(2)  # (B, n_fft // 2 + 1, frames)
    fb = mel_filterbank(n_fft // 2 + 1, n_mels, sample_rate, 0.0, f_max)
    return torch.log(torch.einsum("mf,bft->bmt", fb, power) + eps)


def frames(length: int, hop: int) -> int:
    """Frames :func:`log_mel` gives for ``length`` samples."""
    return 1 + math.floor(length / hop)

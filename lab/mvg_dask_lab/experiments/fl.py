"""The MGM paper's learning schemes (its Sec. 8) in numpy: data, models with hand-written
gradients, and the federated training loops whose uploads are the product's rounds.

* Type I, horizontal FL: participants hold disjoint record sets; each round each samples its
  records (Poisson, rate ``q``), runs ``local_steps`` gradient steps from the global model,
  clips the accumulated gradient to ``[-C, C]`` entrywise and uploads it as a round; the server
  averages the uploads and steps.
* Type II, vertical FL: participants hold disjoint attribute sets of the same records; each
  round each releases its bottom model's tanh features of a Poisson batch (entries in
  ``(-1, 1)``, IDN's condition) to the server's top model (softmax regression on the
  concatenated features), which returns the features' gradients.

The model of Type I is a one-hidden-layer tanh MLP whose two weight matrices are packed into
one ``(d + 1 + K) x (h + 1)`` matrix, so that a round releases one matrix (the column ``h`` of
the first block is structurally zero: its noise is discarded, post-processing).
"""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass
from importlib import resources

import numpy as np

__all__ = [
    "Dataset",
    "HorizontalSetup",
    "PackedMLP",
    "VerticalSetup",
    "horizontal_fl",
    "load_ctg_binary",
    "load_digits_dataset",
    "vertical_fl",
]

#: One round's upload of a participant: (participant, round, matrix) -> released matrix.
Upload = Callable[[int, int, np.ndarray], np.ndarray]


@dataclass(frozen=True, eq=False)
class Dataset:
    """A classification data set, split into train and test (records are rows)."""

    name: str
    X: np.ndarray
    y: np.ndarray
    X_test: np.ndarray
    y_test: np.ndarray
    classes: int
    description: str


def _split(name: str, X: np.ndarray, y: np.ndarray, classes: int, description: str) -> Dataset:
    order = np.random.default_rng(20210427).permutation(len(y))  # a fixed, public split
    cut = round(0.7 * len(y))
    tr, te = order[:cut], order[cut:]
    return Dataset(name, X[tr], y[tr], X[te], y[te], classes, description)


def load_ctg_binary() -> Dataset:
    """CTG (shipped with mvg_dask, UCI Cardiotocography): 21 attributes scaled to [0, 1] by the
    loader's declared bounds, label ``NSP != 1`` (suspect or pathologic: 22 % of the records,
    as Adult's ``>50K`` is 24 %); 2,126 records split 70/30. The stand-in for Adult."""
    from mvg_dask.datasets import load_ctg

    data = load_ctg()
    text = (resources.files("mvg_dask.datasets.data.ctg") / "CTG_Data_sheet.csv").read_text()
    header, _, body = text.partition("\n")
    nsp = header.strip().split(",").index("NSP")
    raw = np.loadtxt(body.splitlines(), delimiter=",", ndmin=2)
    y = (raw[:, nsp] != 1).astype(np.int64)
    return _split(
        "ctg",
        np.asarray(data.X.T, dtype=np.float64),
        y,
        2,
        "CTG (UCI Cardiotocography, shipped with mvg_dask): 2,126 records x 21 attributes in "
        "[0, 1], binary label NSP != 1 (22 % positive); stand-in for Adult (48,842 x 14, "
        "24 % positive), which no package registry ships for offline installation",
    )


def load_digits_dataset() -> Dataset:
    """scikit-learn's digits: 1,797 8x8 images (64 attributes / 16, in [0, 1]), 10 classes,
    split 70/30. The stand-in for MNIST (70,000 28x28 images)."""
    from sklearn.datasets import load_digits

    bunch = load_digits()
    return _split(
        "digits",
        np.asarray(bunch.data, dtype=np.float64) / 16.0,
        np.asarray(bunch.target, dtype=np.int64),
        10,
        "scikit-learn digits: 1,797 records x 64 attributes in [0, 1], 10 classes; stand-in "
        "for MNIST (70,000 x 784)",
    )


# -- Type I: the packed MLP -------------------------------------------------------------------
def _softmax(z: np.ndarray) -> np.ndarray:
    z = z - z.max(axis=1, keepdims=True)
    e = np.exp(z)
    return np.asarray(e / e.sum(axis=1, keepdims=True))


def _with_bias(X: np.ndarray) -> np.ndarray:
    return np.hstack([X, np.ones((X.shape[0], 1))])


@dataclass(frozen=True)
class PackedMLP:
    """``d -> h (tanh) -> K (softmax)``, packed in a ``(d + 1 + K) x (h + 1)`` matrix."""

    d: int
    h: int
    K: int

    @property
    def shape(self) -> tuple[int, int]:
        """The packed matrix's shape."""
        return (self.d + 1 + self.K, self.h + 1)

    def init(self, rng: np.random.Generator) -> np.ndarray:
        """Glorot-like random weights (the structural zeros at zero)."""
        P = np.zeros(self.shape)
        P[: self.d + 1, : self.h] = rng.normal(0, 1 / math.sqrt(self.d + 1), (self.d + 1, self.h))
        P[self.d + 1 :, :] = rng.normal(0, 1 / math.sqrt(self.h + 1), (self.K, self.h + 1))
        return P

    def mask(self, P: np.ndarray) -> np.ndarray:
        """``P`` with its structural zeros restored (post-processing of a noisy matrix)."""
        P = P.copy()
        P[: self.d + 1, self.h] = 0.0
        return P

    def _forward(self, P: np.ndarray, X: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        H = np.tanh(_with_bias(X) @ P[: self.d + 1, : self.h])
        return H, _softmax(_with_bias(H) @ P[self.d + 1 :, :].T)

    def predict(self, P: np.ndarray, X: np.ndarray) -> np.ndarray:
        """Class predictions."""
        return np.asarray(np.argmax(self._forward(P, X)[1], axis=1))

    def gradient(self, P: np.ndarray, X: np.ndarray, y: np.ndarray) -> np.ndarray:
        """The mean cross-entropy's gradient (zero for an empty batch)."""
        G = np.zeros(self.shape)
        if len(y) == 0:
            return G
        H, prob = self._forward(P, X)
        delta_out = prob
        delta_out[np.arange(len(y)), y] -= 1.0
        delta_out /= len(y)
        V = P[self.d + 1 :, :]
        G[self.d + 1 :, :] = delta_out.T @ _with_bias(H)
        delta_h = (delta_out @ V[:, : self.h]) * (1.0 - H * H)
        G[: self.d + 1, : self.h] = _with_bias(X).T @ delta_h
        return G


def _accuracy(pred: np.ndarray, y: np.ndarray) -> float:
    return float(np.mean(pred == y))


def _partition(n: int, parts: int, rng: np.random.Generator) -> list[np.ndarray]:
    return [np.sort(p) for p in np.array_split(rng.permutation(n), parts)]


@dataclass(frozen=True)
class HorizontalSetup:
    """Type I hyper-parameters (public)."""

    participants: int = 5
    hidden: int = 12
    rounds: int = 10
    local_steps: int = 2
    sampling_probability: float = 0.25
    clip: float = 0.02
    local_lr: float = 1.0
    server_lr: float = 1.0


def horizontal_fl(
    data: Dataset,
    setup: HorizontalSetup,
    upload: Upload | None,
    seed: int,
    *,
    compute: Callable[[list[Callable[[], np.ndarray]]], list[np.ndarray]] | None = None,
) -> float:
    """Train Type I and return the test accuracy.

    Parameters
    ----------
    data : Dataset
        The data (the training records are split evenly among the participants).
    setup : HorizontalSetup
        Hyper-parameters.
    upload : callable or None
        ``upload(participant, round, clipped_gradient)``: the released matrix (a round of the
        participant's run); ``None``: the non-private model (no clipping, no noise).
    seed : int
        Initial weights, the partition and the Poisson samples.
    compute : callable, optional
        Runs the participants' tasks of a round (e.g. as Dask tasks); default: in turn.

    Returns
    -------
    float
        Test accuracy of the global model.
    """
    rng = np.random.default_rng(seed)
    model = PackedMLP(data.X.shape[1], setup.hidden, data.classes)
    P = model.init(rng)
    parts = _partition(len(data.y), setup.participants, rng)
    run = compute or (lambda tasks: [t() for t in tasks])
    for t in range(setup.rounds):
        seeds = rng.integers(0, 2**63, size=setup.participants)

        def task(p: int, s: int, P: np.ndarray = P, t: int = t) -> Callable[[], np.ndarray]:
            def go() -> np.ndarray:
                local = np.random.default_rng(s)
                idx = parts[p][local.random(len(parts[p])) < setup.sampling_probability]
                Xp, yp = data.X[idx], data.y[idx]
                W, acc = P.copy(), np.zeros(model.shape)
                for _ in range(setup.local_steps):
                    g = model.gradient(W, Xp, yp)
                    W -= setup.local_lr * g
                    acc += g
                if upload is None:
                    return acc
                return model.mask(upload(p, t, np.clip(acc, -setup.clip, setup.clip)))

            return go

        uploads = run([task(p, int(seeds[p])) for p in range(setup.participants)])
        P = P - setup.server_lr * np.mean(uploads, axis=0)
    return _accuracy(model.predict(P, data.X_test), data.y_test)


# -- Type II: bottom models, tanh features, a top model ---------------------------------------
@dataclass(frozen=True)
class VerticalSetup:
    """Type II hyper-parameters (public)."""

    features: int = 4
    batch: int = 32
    rounds: int = 60
    lr: float = 0.5


def vertical_fl(
    data: Dataset,
    setup: VerticalSetup,
    upload: Upload | None,
    seed: int,
    *,
    compute: Callable[[list[Callable[[], np.ndarray]]], list[np.ndarray]] | None = None,
) -> float:
    """Train Type II (2 participants: the first and second half of the attributes) and return
    the test accuracy (test features are computed without noise).

    Each round draws a Poisson batch (rate ``batch / N``); a participant's feature matrix has
    ``batch`` rows: the sampled records' features, cut at ``batch`` or padded with zero rows
    (the padding is masked in the loss). Its entries lie in ``(-1, 1)`` whatever the records,
    so a round's bound (``clip = 1``) holds for any change of the batch, and the Poisson
    sampling amplifies it per record.
    """
    rng = np.random.default_rng(seed)
    d = data.X.shape[1]
    cols = [np.arange(0, d // 2), np.arange(d // 2, d)]
    h, K, B = setup.features, data.classes, setup.batch
    W = [rng.normal(0, 1 / math.sqrt(len(c) + 1), (len(c) + 1, h)) for c in cols]
    V = rng.normal(0, 1 / math.sqrt(2 * h + 1), (2 * h + 1, K))
    q = min(1.0, B / len(data.y))
    run = compute or (lambda tasks: [t() for t in tasks])
    for t in range(setup.rounds):
        chosen = np.flatnonzero(rng.random(len(data.y)) < q)[:B]
        live = len(chosen)
        Xb = [_with_bias(data.X[chosen][:, c]) for c in cols]

        def task(
            p: int, t: int = t, Xb: list[np.ndarray] = Xb, live: int = live
        ) -> Callable[[], np.ndarray]:
            def go() -> np.ndarray:
                F = np.zeros((B, h))
                F[:live] = np.tanh(Xb[p] @ W[p])
                return F if upload is None else upload(p, t, F)

            return go

        noisy = run([task(0), task(1)])
        if live == 0:
            continue
        Z = _with_bias(np.hstack([noisy[0][:live], noisy[1][:live]]))
        prob = _softmax(Z @ V)
        prob[np.arange(live), data.y[chosen]] -= 1.0
        prob /= live
        grad_Z = prob @ V.T
        V -= setup.lr * (Z.T @ prob)
        for p in range(2):  # the participants' backward pass, on their own clean features
            Fp = np.tanh(Xb[p] @ W[p])
            gF = grad_Z[:, p * h : (p + 1) * h] * (1.0 - Fp * Fp)
            W[p] -= setup.lr * (Xb[p].T @ gF)
    Ft = [np.tanh(_with_bias(data.X_test[:, c]) @ W[p]) for p, c in enumerate(cols)]
    pred = np.argmax(_with_bias(np.hstack(Ft)) @ V, axis=1)
    return _accuracy(pred, data.y_test)

"""GenEval-style scorer for the procedural shapes world.

It judges *generated* images, so it only looks at pixels and at the caption's
claims (``SceneSpec.objects`` / ``relation``), never at ``SceneSpec.rendered``.
Objects are found by colour segmentation (nearest palette colour within a
distance threshold, 8-connected components, minimum area); shapes are named by
the best IoU against templates of the four shapes; sizes by the longer side of
the bounding box. The report follows GenEval: accuracy per task, and an overall
score that is the mean of the per-task accuracies.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np
from PIL import Image

from .scenes import LARGE_MIN_SIDE, PALETTE, SHAPES, ObjectSpec, SceneSpec, shape_mask

# Pixels farther than this (RGB Euclidean) from every palette colour are background.
COLOR_THRESHOLD = 60.0
# Components smaller than this many pixels are noise (a small triangle covers ~40).
MIN_AREA = 15
# A "left of" / "above" claim needs centres this many pixels apart along its axis.
RELATION_MARGIN = 3.0

_PALETTE = np.array(list(PALETTE.values()), dtype=np.float32)
_COLOR_NAMES = tuple(PALETTE)


@dataclass(frozen=True)
class Detection:
    color: str
    shape: str
    size: str
    centre: tuple[float, float]  # (x, y)
    box: tuple[int, int, int, int]  # (x0, y0, x1, y1), end exclusive
    area: int


def _to_array(image: np.ndarray | Image.Image) -> np.ndarray:
    """HxWx3 float array in 0..255 from a PIL image, a uint8 array or a float array in [0, 1]."""
    if isinstance(image, Image.Image):
        return np.asarray(image.convert("RGB"), dtype=np.float32)
    arr = np.asarray(image)
    if arr.dtype == np.uint8:
        return arr.astype(np.float32)
    return np.clip(arr.astype(np.float32), 0.0, 1.0) * 255.0


def _label(classes: np.ndarray) -> np.ndarray:
    """8-connected component labels of equal, non-negative class values (-1 = unlabelled).

    Min-label propagation: each round every pixel takes the smallest label among
    its same-class neighbours, until nothing changes. Vectorised, no scipy.
    """
    h, w = classes.shape
    big = h * w
    labels = np.where(classes >= 0, np.arange(big).reshape(h, w), big)
    pad_c = np.pad(classes, 1, constant_values=-1)
    shifts = [(dy, dx) for dy in (-1, 0, 1) for dx in (-1, 0, 1) if (dy, dx) != (0, 0)]
    same = [pad_c[1 + dy : 1 + dy + h, 1 + dx : 1 + dx + w] == classes for dy, dx in shifts]
    while True:
        pad_l = np.pad(labels, 1, constant_values=big)
        new = labels
        for (dy, dx), ok in zip(shifts, same):
            neighbour = pad_l[1 + dy : 1 + dy + h, 1 + dx : 1 + dx + w]
            new = np.minimum(new, np.where(ok, neighbour, big))
        new = np.where(classes >= 0, new, big)
        if np.array_equal(new, labels):
            return np.where(labels == big, -1, labels)
        labels = new


def _classify_shape(mask: np.ndarray) -> str:
    """Shape whose template, drawn into the component's own box, has the best IoU with it."""
    h, w = mask.shape
    ys, xs = np.mgrid[0:h, 0:w] + 0.5
    side = max(h, w)
    ious = []
    for shape in SHAPES:
        tmpl = shape_mask(shape, side, w / 2, h / 2, xs, ys)
        ious.append((tmpl & mask).sum() / max((tmpl | mask).sum(), 1))
    return SHAPES[int(np.argmax(ious))]


def detect(image: np.ndarray | Image.Image) -> list[Detection]:
    """All palette-coloured objects in ``image``."""
    arr = _to_array(image)
    dist = np.linalg.norm(arr[:, :, None, :] - _PALETTE[None, None], axis=-1)
    nearest = dist.argmin(axis=-1)
    classes = np.where(dist.min(axis=-1) < COLOR_THRESHOLD, nearest, -1)
    labels = _label(classes)
    found: list[Detection] = []
    for lab in np.unique(labels[labels >= 0]):
        ys, xs = np.nonzero(labels == lab)
        if len(ys) < MIN_AREA:
            continue
        x0, x1, y0, y1 = xs.min(), xs.max() + 1, ys.min(), ys.max() + 1
        mask = labels[y0:y1, x0:x1] == lab
        found.append(
            Detection(
                color=_COLOR_NAMES[classes[ys[0], xs[0]]],
                shape=_classify_shape(mask),
                size="large" if max(x1 - x0, y1 - y0) >= LARGE_MIN_SIDE else "small",
                centre=(float(xs.mean()) + 0.5, float(ys.mean()) + 0.5),
                box=(int(x0), int(y0), int(x1), int(y1)),
                area=len(ys),
            )
        )
    return found


def _matches(det: Detection, obj: ObjectSpec) -> bool:
    return (
        det.shape == obj.shape
        and (obj.color is None or det.color == obj.color)
        and (obj.size is None or det.size == obj.size)
    )


def _relation_ok(relation: str, a: Detection, b: Detection) -> bool:
    dx, dy = a.centre[0] - b.centre[0], a.centre[1] - b.centre[1]
    offset = {"left of": -dx, "right of": dx, "above": -dy, "below": dy}[relation]
    return offset >= RELATION_MARGIN


def score(image: np.ndarray | Image.Image, spec: SceneSpec) -> dict:
    """Pass/fail of one image against the caption's claims.

    Counting needs exactly ``count`` matching objects; every other task needs at
    least one match per named object; position also compares the centres of the
    largest match of each of the two objects.
    """
    detections = detect(image)
    matched = [[d for d in detections if _matches(d, obj)] for obj in spec.objects]
    counts = [len(m) for m in matched]
    if spec.task == "counting":
        passed = counts[0] == spec.objects[0].count
    else:
        passed = all(c >= obj.count for c, obj in zip(counts, spec.objects))
    relation_ok = None
    if spec.relation is not None and passed:
        a, b = (max(m, key=lambda d: d.area) for m in matched[:2])
        relation_ok = _relation_ok(spec.relation, a, b)
        passed = relation_ok
    return {"task": spec.task, "passed": bool(passed), "counts": counts, "relation_ok": relation_ok}


def evaluate(images: Sequence[np.ndarray | Image.Image], specs: Sequence[SceneSpec]) -> dict:
    """GenEval-style report: ``per_task`` accuracy, ``overall`` (mean over tasks), ``accuracy`` (over images)."""
    if len(images) != len(specs):
        raise ValueError(f"{len(images)} images but {len(specs)} specs")
    results = [score(img, spec) for img, spec in zip(images, specs)]
    per_task: dict[str, list[bool]] = {}
    for r in results:
        per_task.setdefault(r["task"], []).append(r["passed"])
    task_acc = {t: float(np.mean(v)) for t, v in sorted(per_task.items())}
    return {
        "n": len(results),
        "per_task": task_acc,
        "per_task_n": {t: len(v) for t, v in sorted(per_task.items())},
        "overall": float(np.mean(list(task_acc.values()))) if task_acc else 0.0,
        "accuracy": float(np.mean([r["passed"] for r in results])) if results else 0.0,
        "results": results,
    }

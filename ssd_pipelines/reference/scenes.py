"""Procedural 64x64 "shapes" scenes with GenEval-style captions.

This is the training and evaluation data of the small reference text-to-image
model: it is cheap to generate on a CPU, yet every caption is checkable by
``ssd_pipelines.reference.evaluator`` because the world is a fixed palette of
flat-coloured shapes on low-saturation textured backgrounds.

Determinism and splits
----------------------
Every scene is a pure function of one integer seed (``numpy.random.default_rng``;
no global RNG is touched). Seeds ``< HELDOUT_SEED_START`` (``10**9``) form the
training split, seeds ``>= HELDOUT_SEED_START`` are held out for evaluation;
``make_dataset`` refuses a seed range that straddles the boundary.

Task types follow GenEval: ``single_object`` ("a large circle"), ``colors``
("a red circle"), ``two_object`` ("a circle and a square"), ``color_attr``
("a red circle and a blue square"), ``counting`` ("three green triangles") and
``position`` ("a red circle left of a blue square").
"""

from __future__ import annotations

from collections.abc import Iterator, Sequence
from dataclasses import asdict, dataclass

import numpy as np

IMAGE_SIZE = 64
HELDOUT_SEED_START = 10**9

# Saturated or extreme colours, pairwise far apart and far from the grey backgrounds.
PALETTE: dict[str, tuple[int, int, int]] = {
    "red": (215, 30, 30),
    "green": (40, 170, 50),
    "blue": (35, 70, 220),
    "yellow": (245, 225, 30),
    "purple": (140, 45, 190),
    "orange": (250, 125, 15),
    "white": (245, 245, 245),
    "black": (20, 20, 20),
}
COLORS: tuple[str, ...] = tuple(PALETTE)
SHAPES: tuple[str, ...] = ("circle", "square", "triangle", "cross")
PLURALS: dict[str, str] = {"circle": "circles", "square": "squares", "triangle": "triangles", "cross": "crosses"}
SIZES: tuple[str, ...] = ("small", "large")
# Side of the shape's bounding box in pixels, per size class (inclusive range).
SIZE_RANGE: dict[str, tuple[int, int]] = {"small": (11, 14), "large": (18, 23)}
# Evaluator threshold: boxes with a longer side >= this are "large".
LARGE_MIN_SIDE = 16
RELATIONS: tuple[str, ...] = ("left of", "right of", "above", "below")
NUMBERS: dict[int, str] = {2: "two", 3: "three", 4: "four"}
TASKS: tuple[str, ...] = ("single_object", "colors", "two_object", "color_attr", "counting", "position")

# Every word any caption can contain; the caption tokenizer is built from this list.
VOCABULARY: tuple[str, ...] = tuple(
    ["a", "an", "and", "of", "left", "right", "above", "below"]
    + list(SIZES)
    + list(COLORS)
    + list(SHAPES)
    + list(PLURALS.values())
    + list(NUMBERS.values())
)

# Minimum empty gap between object boxes, in pixels.
_GAP = 3
# A rendered "left of"/"above" pair has centres at least this far apart along the relation's axis.
_RELATION_MARGIN = 8
_NOISE_STD = 3.0
_COLOR_JITTER = 8


@dataclass(frozen=True)
class ObjectSpec:
    """One object (or group of ``count`` identical ones) named by the caption.

    ``None`` attributes are not constrained by the caption and are not checked.
    """

    shape: str
    color: str | None = None
    size: str | None = None
    count: int = 1


@dataclass(frozen=True)
class RenderedObject:
    """Ground truth for one drawn object: what it is and where it landed."""

    shape: str
    color: str
    size: str
    side: int  # bounding-box side in pixels
    centre: tuple[float, float]  # (x, y) in pixels
    box: tuple[int, int, int, int]  # (x0, y0, x1, y1), pixel bounds, end exclusive


@dataclass(frozen=True)
class SceneSpec:
    """Structured description of a scene: the caption's claims plus the rendering truth.

    ``relation`` reads "objects[0] <relation> objects[1]". ``rendered`` is for
    training and debugging only; evaluators of generated images must not use it.
    """

    task: str
    objects: tuple[ObjectSpec, ...]
    relation: str | None = None
    rendered: tuple[RenderedObject, ...] = ()

    def to_dict(self) -> dict:
        return asdict(self)

    @classmethod
    def from_dict(cls, data: dict) -> SceneSpec:
        return cls(
            task=data["task"],
            objects=tuple(ObjectSpec(**o) for o in data["objects"]),
            relation=data.get("relation"),
            rendered=tuple(
                RenderedObject(**{**o, "centre": tuple(o["centre"]), "box": tuple(o["box"])})
                for o in data.get("rendered", ())
            ),
        )


@dataclass(frozen=True)
class Scene:
    """One training/evaluation example."""

    image: np.ndarray  # uint8, (64, 64, 3)
    caption: str
    spec: SceneSpec


def shape_mask(shape: str, side: float, cx: float, cy: float, xs: np.ndarray, ys: np.ndarray) -> np.ndarray:
    """Boolean mask of ``shape`` with a ``side``-pixel bounding box centred on (cx, cy)."""
    dx, dy, h = xs - cx, ys - cy, side / 2
    if shape == "circle":
        return dx * dx + dy * dy <= h * h
    if shape == "square":
        return (np.abs(dx) <= h) & (np.abs(dy) <= h)
    if shape == "triangle":  # pointing up, base at the bottom
        return (dy >= -h) & (dy <= h) & (np.abs(dx) <= (dy + h) / 2)
    if shape == "cross":
        arm = side / 6
        return ((np.abs(dx) <= arm) & (np.abs(dy) <= h)) | ((np.abs(dy) <= arm) & (np.abs(dx) <= h))
    raise ValueError(f"unknown shape {shape!r}")


# 2x2 supersampling offsets: anti-aliased edges instead of hard pixel steps.
_SUB = (0.25, 0.75)
_GRID_Y, _GRID_X = np.mgrid[0:IMAGE_SIZE, 0:IMAGE_SIZE].astype(np.float64)


def _coverage(shape: str, side: float, cx: float, cy: float) -> np.ndarray:
    cov = np.zeros((IMAGE_SIZE, IMAGE_SIZE))
    for oy in _SUB:
        for ox in _SUB:
            cov += shape_mask(shape, side, cx, cy, _GRID_X + ox, _GRID_Y + oy)
    return cov / (len(_SUB) ** 2)


def _background(rng: np.random.Generator) -> np.ndarray:
    """Low-saturation grey gradient with smooth luminance texture."""
    base = rng.uniform(100, 165, size=2)
    tint = rng.uniform(-12, 12, size=(2, 3))
    ends = base[:, None] + tint  # two endpoint colours
    angle = rng.uniform(0, 2 * np.pi)
    t = (np.cos(angle) * (_GRID_X - 31.5) + np.sin(angle) * (_GRID_Y - 31.5)) / 64 + 0.5
    t = np.clip(t, 0, 1)[..., None]
    img = ends[0] * (1 - t) + ends[1] * t
    coarse = rng.normal(0, 1, size=(5, 5))
    # Bilinear upsampling of the coarse grid gives blotchy low-frequency texture.
    pos = np.linspace(0, 4, IMAGE_SIZE)
    i0 = np.minimum(pos.astype(int), 3)
    w = pos - i0
    rows = coarse[i0] * (1 - w[:, None]) + coarse[i0 + 1] * w[:, None]
    tex = rows[:, i0] * (1 - w[None]) + rows[:, i0 + 1] * w[None]
    return img + rng.uniform(4, 9) * tex[..., None]


def render_objects(objects: Sequence[RenderedObject], seed: int) -> np.ndarray:
    """Draw ``objects`` over a random background; the seed drives background, jitter and noise.

    Exposed so tests can render a spec with one thing changed (wrong colour,
    missing object, swapped positions).
    """
    rng = np.random.default_rng(seed)
    img = _background(rng)
    for obj in objects:
        cov = _coverage(obj.shape, obj.side, obj.centre[0], obj.centre[1])[..., None]
        colour = np.array(PALETTE[obj.color], float) + rng.integers(-_COLOR_JITTER, _COLOR_JITTER + 1, size=3)
        img = img * (1 - cov) + colour * cov
    img = img + rng.normal(0, _NOISE_STD, size=img.shape)
    return np.clip(np.rint(img), 0, 255).astype(np.uint8)


def _box(cx: float, cy: float, side: int) -> tuple[int, int, int, int]:
    h = side / 2
    return (int(np.floor(cx - h)), int(np.floor(cy - h)), int(np.ceil(cx + h)), int(np.ceil(cy + h)))


def _separated(a: tuple[int, int, int, int], b: tuple[int, int, int, int]) -> bool:
    return a[2] + _GAP <= b[0] or b[2] + _GAP <= a[0] or a[3] + _GAP <= b[1] or b[3] + _GAP <= a[1]


def _relation_holds(relation: str, a: tuple[float, float], b: tuple[float, float]) -> bool:
    """True when centre ``a`` is clearly ``relation`` centre ``b`` (dominant axis, with margin)."""
    dx, dy = a[0] - b[0], a[1] - b[1]
    if relation in ("left of", "right of"):
        sign = -1 if relation == "left of" else 1
        return sign * dx >= _RELATION_MARGIN and abs(dx) > abs(dy)
    sign = -1 if relation == "above" else 1
    return sign * dy >= _RELATION_MARGIN and abs(dy) > abs(dx)


def _place(
    rng: np.random.Generator, items: Sequence[tuple[str, str, str]], relation: str | None
) -> tuple[RenderedObject, ...] | None:
    """Rejection-sample non-overlapping positions for (shape, colour, size) items."""
    for _ in range(200):
        placed: list[RenderedObject] = []
        for shape, color, size in items:
            side = int(rng.integers(SIZE_RANGE[size][0], SIZE_RANGE[size][1] + 1))
            for _ in range(50):
                lo, hi = 1 + side / 2, IMAGE_SIZE - 1 - side / 2
                cx, cy = (float(v) for v in rng.uniform(lo, hi, size=2))
                box = _box(cx, cy, side)
                if all(_separated(box, p.box) for p in placed):
                    placed.append(RenderedObject(shape, color, size, side, (cx, cy), box))
                    break
            else:
                break
        if len(placed) == len(items) and (
            relation is None or _relation_holds(relation, placed[0].centre, placed[1].centre)
        ):
            return tuple(placed)
    return None


def _article(obj: ObjectSpec) -> str:
    words = [w for w in (obj.size, obj.color) if w is not None] + [obj.shape]
    return " ".join(["an" if words[0][0] in "aeiou" else "a", *words])


def caption_for(spec: SceneSpec) -> str:
    """The caption template of a spec's task."""
    objs = spec.objects
    if spec.task in ("single_object", "colors"):
        return _article(objs[0])
    if spec.task in ("two_object", "color_attr"):
        return f"{_article(objs[0])} and {_article(objs[1])}"
    if spec.task == "counting":
        return f"{NUMBERS[objs[0].count]} {objs[0].color} {PLURALS[objs[0].shape]}"
    if spec.task == "position":
        return f"{_article(objs[0])} {spec.relation} {_article(objs[1])}"
    raise ValueError(f"unknown task {spec.task!r}")


def _pick(rng: np.random.Generator, options: Sequence[str], k: int = 1) -> list[str]:
    return [options[i] for i in rng.choice(len(options), size=k, replace=False)]


def _claims(rng: np.random.Generator, task: str) -> tuple[tuple[ObjectSpec, ...], str | None]:
    """What the caption asserts, per task."""
    if task == "single_object":
        return (ObjectSpec(_pick(rng, SHAPES)[0], size=_pick(rng, SIZES)[0]),), None
    if task == "colors":
        return (ObjectSpec(_pick(rng, SHAPES)[0], color=_pick(rng, COLORS)[0]),), None
    if task == "two_object":
        s1, s2 = _pick(rng, SHAPES, 2)
        return (ObjectSpec(s1), ObjectSpec(s2)), None
    if task == "counting":
        count = int(rng.integers(2, 5))
        return (ObjectSpec(_pick(rng, SHAPES)[0], color=_pick(rng, COLORS)[0], count=count),), None
    # color_attr and position: two objects with distinct colours, so they can be told apart.
    c1, c2 = _pick(rng, COLORS, 2)
    objs = (ObjectSpec(_pick(rng, SHAPES)[0], color=c1), ObjectSpec(_pick(rng, SHAPES)[0], color=c2))
    return objs, (_pick(rng, RELATIONS)[0] if task == "position" else None)


def task_of(seed: int) -> str:
    """The task of scene ``seed``, without rendering it: the first draw of its generator."""
    return _draw_task(np.random.default_rng(seed))


def _draw_task(rng: np.random.Generator) -> str:
    return TASKS[int(rng.integers(len(TASKS)))]


def weighted_seeds(count: int, weights: dict[str, float]) -> list[int]:
    """``count`` training seeds, from 0 upward, whose tasks come in proportion to ``weights`` (a task not named
    weighs 1): more scenes of the tasks a model fails, each a scene of the training split."""
    unknown = set(weights) - set(TASKS)
    if unknown:
        raise ValueError(f"unknown task(s) {', '.join(sorted(unknown))}: choose among {', '.join(TASKS)}")
    share = np.array([weights.get(task, 1.0) for task in TASKS], dtype=float)
    if (share < 0).any() or share.sum() == 0:
        raise ValueError(f"task weights must be >= 0 and not all 0, got {weights}")
    quota = np.floor(count * share / share.sum()).astype(int)
    quota[np.argsort(-share, kind="stable")[: count - quota.sum()]] += 1  # the rounding remainder
    wanted = dict(zip(TASKS, quota.tolist()))
    seeds, seed = [], 0
    while len(seeds) < count:
        task = task_of(seed)
        if wanted[task] > 0:
            wanted[task] -= 1
            seeds.append(seed)
        seed += 1
    _check_split(0, seed)
    return seeds


def sample_scene(seed: int) -> Scene:
    """The scene of ``seed``: task, caption, spec and rendered image."""
    rng = np.random.default_rng(seed)
    task = _draw_task(rng)
    objects, relation = _claims(rng, task)
    items = [
        (o.shape, o.color or _pick(rng, COLORS)[0], o.size or _pick(rng, SIZES)[0])
        for o in objects
        for _ in range(o.count)
    ]
    rendered = _place(rng, items, relation)
    if rendered is None:  # crowded scene: fall back to small objects, which always fit
        rendered = _place(rng, [(s, c, "small") for s, c, _ in items], relation)
    if rendered is None:
        raise RuntimeError(f"could not place the objects of scene {seed}")
    spec = SceneSpec(task=task, objects=objects, relation=relation, rendered=rendered)
    image = render_objects(rendered, int(rng.integers(2**63)))
    return Scene(image=image, caption=caption_for(spec), spec=spec)


def _check_split(seed: int, n: int) -> None:
    if seed < HELDOUT_SEED_START < seed + n:
        raise ValueError(f"seeds {seed}..{seed + n - 1} straddle the held-out boundary {HELDOUT_SEED_START}")


def make_dataset(n: int, seed: int = 0) -> list[Scene]:
    """Scenes for seeds ``seed .. seed+n-1``; pass ``HELDOUT_SEED_START`` (or more) for held-out data."""
    _check_split(seed, n)
    return [sample_scene(s) for s in range(seed, seed + n)]


def iter_scenes(seed: int = 0) -> Iterator[Scene]:
    """Endless stream of scenes from ``seed`` upward, for on-the-fly training; stays in its split."""
    limit = HELDOUT_SEED_START if seed < HELDOUT_SEED_START else None
    s = seed
    while limit is None or s < limit:
        yield sample_scene(s)
        s += 1


def is_heldout(seed: int) -> bool:
    return seed >= HELDOUT_SEED_START

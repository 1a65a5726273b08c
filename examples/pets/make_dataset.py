"""Generate a small, synthetic Oxford-IIIT-Pets-like dataset on local disk.

No downloads: every image is drawn. Each of up to 37 classes (named after the
Oxford pets breeds) gets its own shape and colour, so a model can actually learn
something, and every image gets a trimap like the real dataset's
(1 = pet, 2 = background, 3 = border). The layout mirrors the original::

    DIR/images/<Breed>_<n>.jpg                RGB JPEG, a few different sizes
    DIR/annotations/trimaps/<Breed>_<n>.png   8-bit trimap, same size as the image
    DIR/annotations/list.txt                  "<name> <class 1..37> <species> <breed id>"

``list.txt`` uses the original's 1-based class ids; ``read_pets`` hands back
0-based ids, which is what ``CrossEntropyLoss`` (and the WebDataset ``cls``
field written by ``1_convert.py``) wants.

Run it directly: ``python examples/pets/make_dataset.py DIR --images 200``.
"""

from __future__ import annotations

import argparse
import colorsys
import random
from pathlib import Path
from typing import NamedTuple

from PIL import Image, ImageDraw, ImageFilter

CATS = (
    "Abyssinian Bengal Birman Bombay British_Shorthair Egyptian_Mau Maine_Coon "
    "Persian Ragdoll Russian_Blue Siamese Sphynx"
).split()
DOGS = (
    "american_bulldog american_pit_bull_terrier basset_hound beagle boxer chihuahua "
    "english_cocker_spaniel english_setter german_shorthaired great_pyrenees havanese "
    "japanese_chin keeshond leonberger miniature_pinscher newfoundland pomeranian pug "
    "saint_bernard samoyed scottish_terrier shiba_inu staffordshire_bull_terrier "
    "wheaten_terrier yorkshire_terrier"
).split()
# Oxford pets order: classes sorted case-insensitively, cats and dogs interleaved.
BREEDS: tuple[str, ...] = tuple(sorted(CATS + DOGS, key=str.lower))
SIZES: tuple[tuple[int, int], ...] = ((160, 120), (200, 150), (240, 180), (180, 240))
SHAPES = ("ellipse", "rectangle", "triangle", "diamond")

TRIMAP_PET, TRIMAP_BACKGROUND, TRIMAP_BORDER = 1, 2, 3


class PetRecord(NamedTuple):
    """One image of the dataset, as ``read_pets`` returns it."""

    name: str  # e.g. "Abyssinian_3"; the file stem of image and trimap
    class_id: int  # 0-based
    image: Path
    trimap: Path


def class_colour(class_id: int, classes: int) -> tuple[int, int, int]:
    """A bright colour per class, spread around the hue circle."""
    r, g, b = colorsys.hsv_to_rgb(class_id / max(classes, 1), 0.85, 0.95)
    return int(r * 255), int(g * 255), int(b * 255)


def _rgb(rng: random.Random, lo: int, hi: int) -> tuple[int, int, int]:
    return rng.randint(lo, hi), rng.randint(lo, hi), rng.randint(lo, hi)


def _outline(shape: str, box: tuple[int, int, int, int]) -> list[tuple[int, int]] | None:
    x0, y0, x1, y1 = box
    cx, cy = (x0 + x1) // 2, (y0 + y1) // 2
    if shape == "triangle":
        return [(cx, y0), (x1, y1), (x0, y1)]
    if shape == "diamond":
        return [(cx, y0), (x1, cy), (cx, y1), (x0, cy)]
    return None


def draw_pet(
    class_id: int, classes: int, size: tuple[int, int], rng: random.Random
) -> tuple[Image.Image, Image.Image]:
    """One RGB image and its trimap: a class-coloured shape on a noisy background."""
    w, h = size
    image = Image.new("RGB", size, _rgb(rng, 30, 110))
    draw = ImageDraw.Draw(image)
    for _ in range(6):  # background clutter, so the pet is not the only thing there
        x, y = rng.randrange(w), rng.randrange(h)
        r = rng.randint(4, 18)
        draw.ellipse((x - r, y - r, x + r, y + r), fill=_rgb(rng, 0, 140))

    side = rng.uniform(0.45, 0.75) * min(w, h)
    x0 = rng.uniform(0, w - side)
    y0 = rng.uniform(0, h - side)
    box = (int(x0), int(y0), int(x0 + side), int(y0 + side))
    shape = SHAPES[class_id % len(SHAPES)]
    mask = Image.new("L", size, 0)
    mdraw = ImageDraw.Draw(mask)
    polygon = _outline(shape, box)
    if polygon is not None:
        mdraw.polygon(polygon, fill=255)
    elif shape == "ellipse":
        mdraw.ellipse(box, fill=255)
    else:
        mdraw.rectangle(box, fill=255)
    image.paste(class_colour(class_id, classes), mask=mask)
    image = image.filter(ImageFilter.GaussianBlur(0.8))

    # Trimap: pet inside, background outside, a band of "not sure" on the edge.
    grown = mask.filter(ImageFilter.MaxFilter(5))
    shrunk = mask.filter(ImageFilter.MinFilter(5))
    trimap = Image.new("L", size, TRIMAP_BACKGROUND)
    trimap.paste(TRIMAP_BORDER, mask=grown)
    trimap.paste(TRIMAP_PET, mask=shrunk)
    return image, trimap


def make_pets(
    out_dir: str | Path, images: int = 200, classes: int = 37, seed: int = 0
) -> list[PetRecord]:
    """Write ``images`` images spread evenly over ``classes`` classes under ``out_dir``."""
    if not 1 <= classes <= len(BREEDS):
        raise ValueError(f"classes must be between 1 and {len(BREEDS)}, got {classes}")
    out = Path(out_dir)
    (out / "images").mkdir(parents=True, exist_ok=True)
    (out / "annotations" / "trimaps").mkdir(parents=True, exist_ok=True)
    rng = random.Random(seed)
    lines = [
        "#Image CLASS-ID SPECIES BREED ID",
        "#ID: 1:37 Class ids",
        "#SPECIES: 1:Cat 2:Dog",
        "#BREED ID: 1-12:Cat 1-25:Dog",
        "#Cat breeds start with a capital letter, dog breeds with a lower-case one",
    ]
    per_class: dict[int, int] = {}
    for i in range(images):
        class_id = i % classes
        per_class[class_id] = per_class.get(class_id, 0) + 1
        breed = BREEDS[class_id]
        name = f"{breed}_{per_class[class_id]}"
        image, trimap = draw_pet(class_id, classes, SIZES[i % len(SIZES)], rng)
        image.save(out / "images" / f"{name}.jpg", quality=90)
        trimap.save(out / "annotations" / "trimaps" / f"{name}.png")
        is_cat = breed in CATS
        breed_id = (CATS if is_cat else DOGS).index(breed) + 1
        lines.append(f"{name} {class_id + 1} {1 if is_cat else 2} {breed_id}")
    (out / "annotations" / "list.txt").write_text("\n".join(lines) + "\n")
    return read_pets(out)


def read_pets(data_dir: str | Path) -> list[PetRecord]:
    """The records listed in ``annotations/list.txt``, with 0-based class ids."""
    root = Path(data_dir)
    records = []
    for line in (root / "annotations" / "list.txt").read_text().splitlines():
        if not line.strip() or line.startswith("#"):
            continue
        name, class_id, *_ = line.split()
        records.append(
            PetRecord(
                name=name,
                class_id=int(class_id) - 1,
                image=root / "images" / f"{name}.jpg",
                trimap=root / "annotations" / "trimaps" / f"{name}.png",
            )
        )
    return records


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("out_dir", type=Path)
    parser.add_argument("--images", type=int, default=200)
    parser.add_argument("--classes", type=int, default=37)
    parser.add_argument("--seed", type=int, default=0)
    args = parser.parse_args(argv)
    records = make_pets(args.out_dir, args.images, args.classes, args.seed)
    print(f"wrote {len(records)} images of {args.classes} classes to {args.out_dir}")


if __name__ == "__main__":
    main()

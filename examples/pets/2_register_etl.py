"""Step 2: register a WebDataset ETL that turns each pets sample into a training tensor.

The transform runs on the storage nodes, once per sample of every shard a
client GETs with ``?etl_name=pets-train``. With ``decode="pil"`` the runtime
hands it ``sample["jpg"]`` as a PIL image (and ``sample["cls"]`` as an int);
it returns a new sample::

    {"__key__": ..., "npy": float32 array (3, 224, 224), "cls": int}

The runtime encodes outputs by extension with webdataset's own encoders
(``.npy`` -> ``numpy.save`` format, ``.cls`` -> ASCII integer), so
``wds.WebDataset(url).decode()`` reads it back as an ``ndarray`` and an ``int``.
The image and the trimap are simply left out, so they never cross the network.

The function comes from ``make_transform()`` so that the crop size and the
normalisation are plain values captured in a closure, and its imports are
inside it: cloudpickle ships it by value with everything it needs, and the
transformer only has to have torchvision installed (use ``dependencies=`` if
yours does not).

Run it: ``python examples/pets/2_register_etl.py`` (after ``1_convert.py``).
"""

from __future__ import annotations

import argparse
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from etl_runtime import Client, Etl

ETL_NAME = "pets-train"
IMAGENET_MEAN = (0.485, 0.456, 0.406)
IMAGENET_STD = (0.229, 0.224, 0.225)


def make_transform(
    size: int = 224,
    mean: tuple[float, float, float] = IMAGENET_MEAN,
    std: tuple[float, float, float] = IMAGENET_STD,
) -> Callable[[dict[str, Any]], dict[str, Any]]:
    """A self-contained per-sample function: RandomResizedCrop + ToTensor + Normalize."""

    def pets_to_tensor(sample: dict[str, Any]) -> dict[str, Any]:
        from torchvision import transforms as T

        # Built per call on purpose: it is cheap next to the crop itself, and a
        # module-level cache would not survive pickling anyway.
        augment = T.Compose(
            [T.RandomResizedCrop(size), T.ToTensor(), T.Normalize(mean=mean, std=std)]
        )
        image = sample["jpg"]  # a PIL RGB image, thanks to decode="pil"
        tensor = augment(image)
        return {
            "__key__": sample["__key__"],
            "npy": tensor.numpy(),  # float32, (3, size, size)
            "cls": int(sample["cls"]),
        }

    return pets_to_tensor


def register_etl(
    client: Client,
    name: str = ETL_NAME,
    *,
    size: int = 224,
    on_error: str = "fail",
    workers: int | None = None,
    timeout: float = 180.0,
) -> Etl:
    """Register (or replace) the ETL ``name``; returns its handle once it is Running.

    ``workers`` is the number of worker processes per transformer (default: the
    node's CPU count).
    """
    etl = client.etl(name)
    etl.init_code(
        transform=make_transform(size),
        mode="wds",
        decode="pil",
        on_error=on_error,
        workers=workers,
        timeout=timeout,
    )
    return etl


def main(argv: list[str] | None = None) -> None:
    from etl_runtime import Client

    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--endpoint", default=None, help="gateway URL ($SLUICE_ENDPOINT)")
    parser.add_argument("--name", default=ETL_NAME)
    parser.add_argument("--size", type=int, default=224, help="crop size")
    args = parser.parse_args(argv)
    with Client(args.endpoint) as client:
        print(f"registering wds ETL {args.name!r} on {client.endpoint} ...")
        etl = register_etl(client, args.name, size=args.size)
        details = etl.details()
        print(
            f"ETL {args.name!r} is {details.phase} on {details.ready}/{details.total} "
            f"targets; GET any shard with ?etl_name={args.name}"
        )


if __name__ == "__main__":
    main()

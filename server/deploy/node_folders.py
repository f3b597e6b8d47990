"""The data folders of a local deployment's nodes: those of a split given with `--data` (`silofl data split`),
checked against the deployment's silos or topology before anything starts, or the embedded synthetic dataset split
into DIR/data.
"""

from __future__ import annotations

from pathlib import Path

from silofl.server.deploy.deployment import DeployError
from silofl.server.deploy.topology import NodeLayout

__all__ = ["party_folders", "silo_folders", "write_synthetic_parties"]


def silo_folders(data: Path | None, silos: int, root: Path) -> list[Path]:
    """The folders of `silos` silos (silo_k): `data`'s, checked, or (`data` None) the embedded synthetic dataset
    split as `silofl data split synthetic --silos N` does, into DIR/data (kept if it is there already)."""
    from silofl.client.data.silo_store import load_silo
    from silofl.client.data.tabular import DataError

    if data is None:
        from silofl.client.data.federate import load_federation
        from silofl.client.data.silo_store import save_silo

        data = root / "data"
        if not all((data / f"silo_{k}" / "info.json").is_file() for k in range(silos)):
            _, parts = load_federation("synthetic", silos)
            for k, silo in enumerate(parts):
                save_silo(silo, data / f"silo_{k}")
    folders = [Path(data).resolve() / f"silo_{k}" for k in range(silos)]
    for folder in folders:
        try:
            silo = load_silo(folder)
        except DataError as exc:
            hint = (
                "; it holds party folders (features_*, sensitive_*): pass the --topology it was split with"
                if (Path(data) / "features_0").is_dir()
                else ""
            )
            raise DeployError(
                f"--data: {exc} (expected silo_0 ... silo_{silos - 1} from `silofl data split`{hint})"
            ) from None
        if silo.num_silos != silos:
            raise DeployError(f"--data: {folder} is one of {silo.num_silos} silos, but --silos is {silos}")
    return folders


def party_folders(data: Path | None, layout: NodeLayout, root: Path) -> list[Path]:
    """The folders of `layout`'s parties (features_k, sensitive_c): `data`'s, checked, or (`data` None) the embedded
    synthetic dataset split as `silofl data split synthetic --silos N --topology T` does, into DIR/data."""
    from silofl.client.data.party_store import load_party, read_party_info
    from silofl.client.data.tabular import DataError

    def fits(folder: Path, role: str, party_id: int) -> str:
        """What is wrong with `folder` as `role` party `party_id` of `layout` (empty if nothing)."""
        try:
            info = read_party_info(folder)
        except DataError as exc:
            return str(exc)
        count = layout.silos if role == "features" else layout.sensitive
        if info["role"] != role or info["party_id"] != party_id or info["num_parties"] != count:
            kind = {"features": "feature", "sensitive": "sensitive"}
            return (
                f"{folder} is {kind[info['role']]} party {info['party_id']} of {info['num_parties']}, but --topology "
                f"{layout.topology} with --silos {layout.silos} needs {kind[role]} party {party_id} of {count} here"
            )
        return ""

    if data is None:
        data = root / "data"
        if any(fits(data / name, role, k) for name, role, k in layout.nodes):
            write_synthetic_parties(data, layout)
    data = Path(data).resolve()
    expected = (
        f"expected {', '.join(layout.names)} from `silofl data split DATASET --silos {layout.silos} --topology "
        f"{layout.topology}{f' --sensitive-parties {layout.sensitive}' if layout.topology == 'general' else ''}`"
    )
    if not any((data / name).is_dir() for name in layout.names) and (data / "silo_0").is_dir():
        raise DeployError(
            f"--data {data} holds silo folders (silo_0, ...) but --topology is {layout.topology}: drop --topology to "
            f"deploy silos, or {expected}"
        )
    folders = []
    for name, role, k in layout.nodes:
        folder = data / name
        problem = fits(folder, role, k)
        if not problem:
            try:
                load_party(folder, role=role)  # every file, not just info.json: a bad folder fails here
            except DataError as exc:
                problem = str(exc)
        if problem:
            raise DeployError(f"--data: {problem} ({expected})")
        folders.append(folder)
    return folders


def write_synthetic_parties(out: Path, layout: NodeLayout) -> None:
    """`silofl data split synthetic --silos N --topology T [--sensitive-parties S] --out OUT`, with its defaults."""
    from silofl.client.data.loaders import load_dataset
    from silofl.client.data.party_store import save_party
    from silofl.client.data.topology import split_parties

    ds = load_dataset("synthetic", seed=0)
    features, sensitive = split_parties(
        ds, layout.topology, feature_parties=layout.silos, sensitive_parties=layout.sensitive, seed=0
    )
    for party in features:
        save_party(party, out / f"features_{party.party_id}", num_parties=len(features))
    for party in sensitive:
        save_party(party, out / f"sensitive_{party.party_id}", num_parties=len(sensitive))

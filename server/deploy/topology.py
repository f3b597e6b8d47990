"""Which SuperNodes a deployment of a topology has, and what each is called.

A deployment of topology ``silos`` has N silos, ``silo_0`` ... ``silo_<N-1>`` (both divisions of a record on one
node, today's federation). Every other topology (SteFFLe Section 4 and Appendix F) has N *feature parties*
``features_0`` ... ``features_<N-1>`` (record ids, features, labels) and S *sensitive parties* ``sensitive_0`` ...
``sensitive_<S-1>`` (record ids, sensitive groups): S = N for ``divided``, 1 for ``central-sensitive`` (a census
bureau), `--sensitive-parties` for ``general``. The names are those of the folders `silofl data split --topology`
writes, and `silofl deploy certs` names each node's key pair the same way, so a reader sees which key goes with
which data. N is always `--silos` / the run config's `num-silos`: the silos, or the feature parties.
"""

from __future__ import annotations

from dataclasses import dataclass

from silofl.client.data.topology import TOPOLOGIES

__all__ = ["TOPOLOGIES", "NodeLayout", "TopologyError", "node_layout"]

SILO, FEATURES, SENSITIVE = "silo", "features", "sensitive"  # node config `role` values (protocols.parties.ROLES)


class TopologyError(ValueError):
    """A topology, or its number of parties, that a deployment cannot have; the message names the flag and the fix."""


@dataclass(frozen=True)
class NodeLayout:
    """The SuperNodes of one deployment: `silos` silos (topology ``silos``) or `silos` feature parties and
    `sensitive` sensitive parties."""

    topology: str
    silos: int
    sensitive: int

    @property
    def parties(self) -> bool:
        """True when features and sensitive attributes live on separate nodes (every topology but ``silos``)."""
        return self.topology != "silos"

    @property
    def nodes(self) -> tuple[tuple[str, str, int], ...]:
        """(name, role, id among its role) of every node: the silos, or the feature then the sensitive parties."""
        if not self.parties:
            return tuple((f"silo_{k}", SILO, k) for k in range(self.silos))
        return tuple((f"features_{k}", FEATURES, k) for k in range(self.silos)) + tuple(
            (f"sensitive_{c}", SENSITIVE, c) for c in range(self.sensitive)
        )

    @property
    def names(self) -> tuple[str, ...]:
        """The node names, in the order of :attr:`nodes` (data folders, key files, process names)."""
        return tuple(name for name, _, _ in self.nodes)

    def run_config(self) -> str:
        """The `flwr run --run-config` keys that describe this federation to the ServerApp.

        ``num-silos=N`` for silos (as before parties existed); for parties also ``algorithm="steffle"`` (the
        algorithm that runs on separate parties; the app's default algorithm does not) and ``topology=...``, plus
        ``sensitive-parties=S`` for ``general`` (the other topologies fix S).
        """
        if not self.parties:
            return f"num-silos={self.silos}"
        keys = f'algorithm="steffle" topology="{self.topology}" '
        if self.topology == "general":
            keys += f"sensitive-parties={self.sensitive} "
        return keys + f"num-silos={self.silos}"

    def describe(self) -> str:
        """E.g. "3 silos" or "3 feature parties and 1 sensitive party (central-sensitive)"."""
        if not self.parties:
            return f"{self.silos} silo{'s' * (self.silos != 1)}"
        return (
            f"{self.silos} feature part{'ies' if self.silos != 1 else 'y'} and {self.sensitive} sensitive "
            f"part{'ies' if self.sensitive != 1 else 'y'} ({self.topology})"
        )


def node_layout(silos: int, topology: str = "silos", sensitive_parties: int | None = None) -> NodeLayout:
    """The nodes of `topology` with `silos` silos or feature parties; `sensitive_parties` only for ``general``.

    TopologyError (naming `--topology`, `--silos` or `--sensitive-parties`) for an unknown topology, a count that
    is not a positive integer, `--sensitive-parties` with a topology that fixes it, or ``general`` without it.
    """
    if topology not in TOPOLOGIES:
        raise TopologyError(f"--topology {topology!r}: choose one of {', '.join(TOPOLOGIES)}")
    if isinstance(silos, bool) or not isinstance(silos, int) or silos < 1:
        raise TopologyError(f"--silos must be a positive integer, got {silos!r}")
    if sensitive_parties is not None and (
        isinstance(sensitive_parties, bool) or not isinstance(sensitive_parties, int) or sensitive_parties < 1
    ):
        raise TopologyError(f"--sensitive-parties must be a positive integer, got {sensitive_parties!r}")
    if topology == "general":
        if sensitive_parties is None:
            raise TopologyError("--topology general needs --sensitive-parties S (the number of sensitive parties)")
        return NodeLayout(topology, silos, sensitive_parties)
    fixed = {"silos": 0, "divided": silos, "central-sensitive": 1}[topology]
    if sensitive_parties is not None:
        what = {
            "silos": "has no separate sensitive parties",
            "divided": "has one sensitive party per feature party",
            "central-sensitive": "has one sensitive party",
        }[topology]
        raise TopologyError(
            f"--sensitive-parties is for --topology general; {topology} {what}: drop --sensitive-parties, or use "
            "--topology general"
        )
    return NodeLayout(topology, silos, fixed)

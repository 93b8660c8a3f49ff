"""Reading pruning records, checked against the model they describe: the one place attnviz believes them.

Two records say which heads a pruned model still holds:

* ``attnviz-pruned.json`` beside a pruned Hugging Face checkpoint (format in
  :mod:`attnviz.models.pruned_format`): per site, the original number of every head the weights hold
  (``kept_heads``), the heads removed (``removed_heads``) and those removed but kept with zeroed output
  (``masked_heads``);
* a toy checkpoint's ``metadata["pruned"]["removed"]``: the history of removals, one mapping
  ``{"self.0": [heads removed then]}`` per pruning, numbered as the model was at that time.

Both are text a user can edit, so every number is checked against the model's own layout (the heads of the
full-size model and the heads its weights hold) before the record is used; a record that disagrees raises
:class:`RecordError`, whose message says what disagrees. The loaders turn it into one error naming the file.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from attnviz.common.errors import AttnvizError
from attnviz.core import AttentionSite
from attnviz.models.identity import HeadIdentity


class RecordError(AttnvizError):
    """A pruning record that disagrees with itself or with the model's weights."""


def _count(value: Any, what: str) -> int:
    if isinstance(value, bool) or not isinstance(value, int) or value < 0:
        raise RecordError(f"{what} is {value!r}, not a count")
    return value


def _heads(value: Any, what: str, limit: int) -> list[int]:
    """A list of distinct head numbers below ``limit``."""
    if not isinstance(value, list):
        raise RecordError(f"{what} is {value!r}, not a list of head numbers")
    heads = [_count(head, f"an entry of {what}") for head in value]
    beyond = sorted({head for head in heads if head >= limit})
    if beyond:
        raise RecordError(f"{what} names head {beyond[0]}, but the layer has heads 0–{limit - 1}")
    repeated = sorted({head for head in heads if heads.count(head) > 1})
    if repeated:
        raise RecordError(f"{what} names head {repeated[0]} more than once")
    return heads


def _site(entry: Mapping, original: Mapping[AttentionSite, tuple[int, int]]) -> AttentionSite:
    stack, layer = entry.get("stack"), entry.get("layer")
    if not isinstance(stack, str):
        raise RecordError(f"a site's stack is {stack!r}, not a name")
    site = AttentionSite(stack, _count(layer, f"the layer of a {stack} site"))
    if site not in original:
        names = ", ".join(s.name for s in sorted(original))
        raise RecordError(f"it names attention site {site.name}, which the model lacks (it has {names})")
    return site


def identity_from_marker(
    record: Any, original: Mapping[AttentionSite, tuple[int, int]]
) -> tuple[HeadIdentity, dict[AttentionSite, tuple[int, int]]]:
    """The identity an ``attnviz-pruned.json`` ``record`` gives, and the ``(heads, key/value heads)`` each site's
    weights must hold, checked against ``original`` (site -> (heads, key/value heads) of the full-size model).

    Raises :class:`RecordError` on any disagreement.
    """
    sites = record.get("sites") if isinstance(record, dict) else None
    if not isinstance(sites, list) or not all(isinstance(entry, dict) for entry in sites):
        raise RecordError('"sites" is not a list of site entries')
    identity = HeadIdentity()
    counts: dict[AttentionSite, tuple[int, int]] = {}
    for entry in sites:
        site = _site(entry, original)
        if site in counts:
            raise RecordError(f"it describes site {site.name} twice")
        full_heads, full_kv = original[site]
        where = f"{site.name}'s"
        if entry.get("original_heads") != full_heads:
            raise RecordError(
                f"it says {site.name} had {entry.get('original_heads')!r} heads, but the model's config gives it "
                f"{full_heads}: the record belongs to another model"
            )
        if entry.get("original_kv_heads", full_kv) != full_kv:
            raise RecordError(
                f"it says {site.name} had {entry.get('original_kv_heads')!r} key/value heads; the config gives {full_kv}"
            )
        heads = _count(entry.get("heads"), f"{where} heads")
        kv_heads = _count(entry.get("kv_heads"), f"{where} kv_heads")
        kept = _heads(entry.get("kept_heads"), f"{where} kept_heads", full_heads)
        removed = _heads(entry.get("removed_heads", []), f"{where} removed_heads", full_heads)
        masked = _heads(entry.get("masked_heads", []), f"{where} masked_heads", full_heads)
        if len(kept) != heads:
            raise RecordError(f"{where} kept_heads lists {len(kept)} heads but its count says {heads}")
        if not heads:
            raise RecordError(f"it keeps no head of {site.name}: a layer keeps at least one head")
        if "kept_kv_heads" in entry:
            kept_kv = _heads(entry["kept_kv_heads"], f"{where} kept_kv_heads", full_kv)
            if len(kept_kv) != kv_heads:
                raise RecordError(f"{where} kept_kv_heads lists {len(kept_kv)} heads but kv_heads says {kv_heads}")
        if not set(masked) <= set(kept) & set(removed):
            raise RecordError(f"{where} masked_heads must be heads both kept and removed; {masked} are not")
        sliced = set(range(full_heads)) - set(kept)
        if set(removed) - set(masked) != sliced:
            raise RecordError(
                f"{where} removed_heads {removed} disagree with kept_heads {kept}: every head not kept must be "
                "removed, and a removed head that is kept must be masked"
            )
        counts[site] = (heads, kv_heads)
        _place(identity.heads, site, kept)
        _place(identity.masked, site, masked)
    identity.original_heads = _per_stack({site: heads for site, (heads, _) in original.items()})
    return identity, counts


def identity_from_history(history: Any, layout: Mapping[AttentionSite, int], original_heads: int) -> HeadIdentity:
    """The identity a toy model's pruning ``history`` gives, checked against its ``layout`` (heads now) and the
    ``original_heads`` every site had before pruning.

    Each entry of the history maps a site name (``"self.0"``) to the heads removed then, numbered as the model
    was at that time; replaying the entries in order gives each remaining head's original number.
    """
    if not isinstance(history, list) or not all(isinstance(entry, dict) for entry in history):
        raise RecordError('"removed" is not a list of mappings from site (like "self.0") to the heads removed')
    by_name = {site.name: site for site in layout}
    ids = {site: list(range(original_heads)) for site in layout}
    for step, entry in enumerate(history):
        for name, heads in entry.items():
            site = by_name.get(name)
            if site is None:
                raise RecordError(f"removal {step + 1} names site {name!r}, which the model lacks")
            gone = _heads(heads, f"removal {step + 1} of {name}", len(ids[site]))
            ids[site] = [original for position, original in enumerate(ids[site]) if position not in set(gone)]
    identity = HeadIdentity()
    for site, count in sorted(layout.items()):
        if len(ids[site]) != count:
            raise RecordError(
                f"its removals leave {site.name} {len(ids[site])} of {original_heads} heads, but the weights hold {count}"
            )
        _place(identity.heads, site, ids[site])
    identity.original_heads = _per_stack(dict.fromkeys(layout, original_heads))
    return identity


def _place(table: dict[str, list[list[int]]], site: AttentionSite, heads: list[int]) -> None:
    layers = table.setdefault(site.stack, [])
    while len(layers) <= site.layer:
        layers.append([])
    layers[site.layer] = heads


def _per_stack(counts: Mapping[AttentionSite, int]) -> dict[str, list[int]]:
    """site -> count as stack -> one count per layer."""
    table: dict[str, list[int]] = {}
    for site, count in sorted(counts.items()):
        layers = table.setdefault(site.stack, [])
        layers.extend([0] * (site.layer + 1 - len(layers)))
        layers[site.layer] = count
    return table

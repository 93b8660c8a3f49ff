"""The closed sets of the head analyses; imports nothing heavy (the command line lists them)."""

from __future__ import annotations

from typing import Literal, get_args

#: which decoder rows stand for a target word in alignment: the rows predicting it, or those reading it
RowChoice = Literal["predicting", "reading"]
ALIGNMENT_ROWS: tuple[str, ...] = get_args(RowChoice)

#: how the query–key map (attnviz.heads.query_key) places a head's queries and keys in 2-D
Projection = Literal["pca", "tsne"]
PROJECTIONS: tuple[str, ...] = get_args(Projection)

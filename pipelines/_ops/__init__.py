"""Operations around pipelines: the ``slicefeed`` CLI and cluster commands.

Private: the public names (``SliceSpec``, the placement helpers) are exported by
:mod:`slicefeed.pipelines`.
"""

"""sediment's network protocol: Arrow Flight between ``sediment serve`` (:mod:`sediment.server`)
and :class:`sediment.client.Client`. The pieces both sides use live here (op names and the
fields of each message in :mod:`sediment.net.messages`, constants and codecs in
:mod:`sediment.net.protocol`, typed errors in :mod:`sediment.net.wire_errors`), so
the client imports neither the server nor the engine; the server's transaction
bookkeeping is :mod:`sediment.net.txn_registry`. The wire protocol (version 1: every call,
ticket and action body, and what each field means) is in docs/formats.md ("Network protocol").
"""

"""A process's side of a channel: its handle, its link to the channel worker, local channels.

Imports only :mod:`~p2p_worker._channels._protocol` (and lower p2p_worker layers), never
:mod:`~p2p_worker._channels._server`.

- :mod:`~p2p_worker._channels._client.operations`: what a channel handle does (put,
  get, sizes, close, destroy);
- :mod:`~p2p_worker._channels._client.link`: one process's link to a channel worker
  (issuing requests, sending payloads), :mod:`~p2p_worker._channels._client.answers`:
  its receiving half,
  :mod:`~p2p_worker._channels._client.connect`: finding and connecting it,
  :mod:`~p2p_worker._channels._client.handshake`: opening its groups;
- :mod:`~p2p_worker._channels._client.acks`, :mod:`~p2p_worker._channels._client.order`,
  :mod:`~p2p_worker._channels._client.inline`, :mod:`~p2p_worker._channels._client.prefetch`,
  :mod:`~p2p_worker._channels._client.linger`, :mod:`~p2p_worker._channels._client.failure`:
  acknowledgements, answer order, inline puts, prefetched items, linger timers, failures;
- :mod:`~p2p_worker._channels._client.work`: the handles of its operations;
- :mod:`~p2p_worker._channels._client.endpoint`: where a process stands in a job;
- :mod:`~p2p_worker._channels._client.local`: :class:`LocalChannel`, RLinf's in-process one.
"""

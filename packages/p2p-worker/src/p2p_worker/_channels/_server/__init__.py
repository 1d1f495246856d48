"""The channel worker's side: the Ray actor that holds one channel, and its bookkeeping.

Imports only :mod:`~p2p_worker._channels._protocol` (and lower p2p_worker layers), never
:mod:`~p2p_worker._channels._client`.

- :mod:`~p2p_worker._channels._server.server`: :class:`ChannelWorker`, the actor (its
  links, Ray calls and lifetime), with its parts
  :mod:`~p2p_worker._channels._server.requests` (serving a peer's requests in order),
  :mod:`~p2p_worker._channels._server.puts` (slots, credits and payloads coming in) and
  :mod:`~p2p_worker._channels._server.views` (its read-only Ray methods);
- :mod:`~p2p_worker._channels._server.queue`: slots, items and waiters inside it;
- :mod:`~p2p_worker._channels._server.peers`, :mod:`~p2p_worker._channels._server.readers`,
  :mod:`~p2p_worker._channels._server.replies`: what it keeps per peer, how it reads
  requests and payloads, how it answers;
- :mod:`~p2p_worker._channels._server.sole`: whom it may send items ahead;
- :mod:`~p2p_worker._channels._server.launched`, :mod:`~p2p_worker._channels._server.lifetime`:
  a channel worker launched as a group, and its end with the job.
"""

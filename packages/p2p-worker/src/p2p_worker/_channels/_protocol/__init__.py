"""What both sides of a channel agree on: names, requests and answers, keys, errors.

The bottom of ``_channels``: imported by :mod:`~p2p_worker._channels._client` and
:mod:`~p2p_worker._channels._server`, it imports neither (only lower p2p_worker layers).

- :mod:`~p2p_worker._channels._protocol.proto`: names, the creation spec, the hello
  answer, the requests and the answer codes on the wire;
- :mod:`~p2p_worker._channels._protocol.payload`: what a payload counts, and the
  ``Void`` that fills a slot without an item;
- :mod:`~p2p_worker._channels._protocol.keys`: keys and weights of items;
- :mod:`~p2p_worker._channels._protocol.errors`: the channel errors both sides raise.
"""

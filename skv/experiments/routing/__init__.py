"""The routing study on real engines: the router service in front of several vLLM CPU engines,
each router's measured cache hits against the simulator's (``study``). Config in
``experiments/routing/``, notebook in ``notebooks/routing/``. The routers themselves are
:mod:`skv.routing`.
"""

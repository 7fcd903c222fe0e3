"""Serving: three ways to serve one app over one control state, side by side.

================  ==========================================  =====================================
shape             module                                      control state (``mocksandbox.control``)
================  ==========================================  =====================================
one process       :mod:`~mocksandbox.serving.single`          ``LocalControlState``, in process
N workers         :mod:`~mocksandbox.serving.workers`         ``PooledControlState`` in the master,
                  (``serve --workers N``)                     shared counters and one-way messages
a Ray fleet       :mod:`~mocksandbox.serving.fleet`           ``ControlActor``, a named Ray actor
                  (``serve --ray``)
================  ==========================================  =====================================

Each shape serves the same WSGI app (``mocksandbox.web.create_app``) on the same request handler
(``single.MockServer``, but for the fleet, which Ray Serve's proxies front), and each has a
foreground runner that ``mocksandbox serve`` calls (``serve_single``, ``serve_workers``,
``serve_fleet``) and prints the banner of :mod:`~mocksandbox.serving.banner`. Features never ask
which shape serves them: they talk to the control state's interface.

Nothing is imported here: the fleet needs Ray, the workers a process pool.
"""

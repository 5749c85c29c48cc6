"""The ``server`` backend: an OpenAI-compatible HTTP server, launched by the actor or running elsewhere.

``process`` starts and stops a launched server (a process group, never outliving its
actor: ``reaper``), ``client`` sends a serving run's requests over HTTP and stamps
every streamed chunk, ``backend`` ties them into the ``Backend`` interface that the
serving method (``actors.serving_measure``) drives like any in-process engine.
"""

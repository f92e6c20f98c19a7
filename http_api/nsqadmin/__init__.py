"""nsqadmin's process floor: the ``nsqadmin`` command (``main``), gunicorn (``server``), the Falcon app (``app``)
and the single-page UI it serves (``static/``)."""

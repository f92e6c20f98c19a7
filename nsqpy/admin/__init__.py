"""nsqadmin's library floor: asking the cluster (``upstream``, ``cluster``), Go nsqadmin's JSON shapes
(``aggregate``), the API's calls (``service``), health findings over successive samples (``health``),
notifications (``notify``) and the Prometheus totals (``metrics``). No HTTP server and no process code here:
those are in http_api/nsqadmin/."""

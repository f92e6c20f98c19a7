"""Control: the shared control block, and the commands other processes send a topic's owner with their client side."""

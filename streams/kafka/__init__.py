"""Everything that talks to Kafka outside the worker's Faust app: the clients
and their security, the topic admin, the connection options of the commands,
and the reader of topic ranges."""

"""What master and worker say to each other: the message schema, its codec, and the keys and
handshakes that authenticate both the command socket and the data channels."""

"""Key-value stores through which ranks find each other, and the rendezvous over them."""

from .rendezvous import rendezvous, store_from_url
from .stores import FileStore, HashStore, PrefixStore, Store
from .tcp_store import TCPStore

__all__ = ["FileStore", "HashStore", "PrefixStore", "Store", "TCPStore", "rendezvous",
           "store_from_url"]

"""kombu's filesystem transport, with message files that appear whole or not at all.

kombu's own `_put` creates the message file and then writes it. A consumer polling the
folder can move and read the file in between, get an empty payload, and the job is lost
(until the API's reaper sends it again, minutes later). Here a message is written under a
staging name that consumers skip (they only take `*.<queue>.msg`) and renamed into place.
"""

from __future__ import annotations

import os
import uuid
from time import monotonic
from typing import Any

from kombu.exceptions import ChannelError
from kombu.transport import filesystem
from kombu.utils.encoding import str_to_bytes
from kombu.utils.json import dumps


class Channel(filesystem.Channel):
    """The filesystem channel with an atomic put."""

    # kombu names the argument `message` in its base class and `payload` here: keep theirs.
    def _put(self, queue: Any, payload: Any, **kwargs: Any) -> Any:  # type: ignore[override]
        name = f"{round(monotonic() * 1000)}_{uuid.uuid4()}.{queue}.msg"
        final = os.path.join(self.data_folder_out, name)
        staging = final + ".part"
        try:
            with open(staging, "wb") as handle:
                handle.write(str_to_bytes(dumps(payload)))
            os.replace(staging, final)
        except OSError as exc:
            raise ChannelError(f"Cannot add file {final!r} to directory") from exc


class Transport(filesystem.Transport):
    """The embedded broker of `torchport serve`."""

    Channel = Channel

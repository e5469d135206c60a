from google.protobuf.internal import containers as _containers
from google.protobuf.internal import enum_type_wrapper as _enum_type_wrapper
from google.protobuf import descriptor as _descriptor
from google.protobuf import message as _message
from collections.abc import Iterable as _Iterable, Mapping as _Mapping
from typing import ClassVar as _ClassVar, Optional as _Optional, Union as _Union

DESCRIPTOR: _descriptor.FileDescriptor

class RequestType(int, metaclass=_enum_type_wrapper.EnumTypeWrapper):
    __slots__ = ()
    Invalid: _ClassVar[RequestType]
    Ping: _ClassVar[RequestType]
    Lock: _ClassVar[RequestType]
    Unlock: _ClassVar[RequestType]
    Renew: _ClassVar[RequestType]
    Inspect: _ClassVar[RequestType]
    Hello: _ClassVar[RequestType]
    OpenSession: _ClassVar[RequestType]
    CloseSession: _ClassVar[RequestType]
    ClusterStatus: _ClassVar[RequestType]
    ClusterAdd: _ClassVar[RequestType]
    ClusterRemove: _ClassVar[RequestType]
    Enqueue: _ClassVar[RequestType]
    Wait: _ClassVar[RequestType]
    Proclaim: _ClassVar[RequestType]
    Watch: _ClassVar[RequestType]

class ResponseStatus(int, metaclass=_enum_type_wrapper.EnumTypeWrapper):
    __slots__ = ()
    Ok: _ClassVar[ResponseStatus]
    General: _ClassVar[ResponseStatus]
    Version: _ClassVar[ResponseStatus]
    InvalidType: _ClassVar[ResponseStatus]
    AccessDenied: _ClassVar[ResponseStatus]
    ShuttingDown: _ClassVar[ResponseStatus]
    LimitReached: _ClassVar[ResponseStatus]
    FrameTooLarge: _ClassVar[ResponseStatus]
    NotLeader: _ClassVar[ResponseStatus]
    Unavailable: _ClassVar[ResponseStatus]
    TooManyKeys: _ClassVar[ResponseStatus]
    InvalidKey: _ClassVar[ResponseStatus]
    NoKeys: _ClassVar[ResponseStatus]
    InvalidArgument: _ClassVar[ResponseStatus]
    AcquireTimeout: _ClassVar[ResponseStatus]
    NotHeld: _ClassVar[ResponseStatus]
    UnknownSession: _ClassVar[ResponseStatus]
    ModeConflict: _ClassVar[ResponseStatus]
    LimitMismatch: _ClassVar[ResponseStatus]
    Queued: _ClassVar[ResponseStatus]
    UnknownTicket: _ClassVar[ResponseStatus]
    ValueTooLarge: _ClassVar[ResponseStatus]
    WatchLimit: _ClassVar[ResponseStatus]
Invalid: RequestType
Ping: RequestType
Lock: RequestType
Unlock: RequestType
Renew: RequestType
Inspect: RequestType
Hello: RequestType
OpenSession: RequestType
CloseSession: RequestType
ClusterStatus: RequestType
ClusterAdd: RequestType
ClusterRemove: RequestType
Enqueue: RequestType
Wait: RequestType
Proclaim: RequestType
Watch: RequestType
Ok: ResponseStatus
General: ResponseStatus
Version: ResponseStatus
InvalidType: ResponseStatus
AccessDenied: ResponseStatus
ShuttingDown: ResponseStatus
LimitReached: ResponseStatus
FrameTooLarge: ResponseStatus
NotLeader: ResponseStatus
Unavailable: ResponseStatus
TooManyKeys: ResponseStatus
InvalidKey: ResponseStatus
NoKeys: ResponseStatus
InvalidArgument: ResponseStatus
AcquireTimeout: ResponseStatus
NotHeld: ResponseStatus
UnknownSession: ResponseStatus
ModeConflict: ResponseStatus
LimitMismatch: ResponseStatus
Queued: ResponseStatus
UnknownTicket: ResponseStatus
ValueTooLarge: ResponseStatus
WatchLimit: ResponseStatus

class Request(_message.Message):
    __slots__ = ("version", "id", "access_token", "type", "session", "session_ttl_micro", "seq", "seq_done", "lock", "cluster")
    VERSION_FIELD_NUMBER: _ClassVar[int]
    ID_FIELD_NUMBER: _ClassVar[int]
    ACCESS_TOKEN_FIELD_NUMBER: _ClassVar[int]
    TYPE_FIELD_NUMBER: _ClassVar[int]
    SESSION_FIELD_NUMBER: _ClassVar[int]
    SESSION_TTL_MICRO_FIELD_NUMBER: _ClassVar[int]
    SEQ_FIELD_NUMBER: _ClassVar[int]
    SEQ_DONE_FIELD_NUMBER: _ClassVar[int]
    LOCK_FIELD_NUMBER: _ClassVar[int]
    CLUSTER_FIELD_NUMBER: _ClassVar[int]
    version: int
    id: int
    access_token: str
    type: RequestType
    session: int
    session_ttl_micro: int
    seq: int
    seq_done: int
    lock: RequestLock
    cluster: RequestCluster
    def __init__(self, version: _Optional[int] = ..., id: _Optional[int] = ..., access_token: _Optional[str] = ..., type: _Optional[_Union[RequestType, str]] = ..., session: _Optional[int] = ..., session_ttl_micro: _Optional[int] = ..., seq: _Optional[int] = ..., seq_done: _Optional[int] = ..., lock: _Optional[_Union[RequestLock, _Mapping]] = ..., cluster: _Optional[_Union[RequestCluster, _Mapping]] = ...) -> None: ...

class RequestCluster(_message.Message):
    __slots__ = ("node_id", "client_addr", "peer_addr")
    NODE_ID_FIELD_NUMBER: _ClassVar[int]
    CLIENT_ADDR_FIELD_NUMBER: _ClassVar[int]
    PEER_ADDR_FIELD_NUMBER: _ClassVar[int]
    node_id: int
    client_addr: str
    peer_addr: str
    def __init__(self, node_id: _Optional[int] = ..., client_addr: _Optional[str] = ..., peer_addr: _Optional[str] = ...) -> None: ...

class ClusterInfo(_message.Message):
    __slots__ = ("node_id", "role", "term", "leader_id", "last_log_index", "committed_index", "last_applied_index", "members", "version")
    NODE_ID_FIELD_NUMBER: _ClassVar[int]
    ROLE_FIELD_NUMBER: _ClassVar[int]
    TERM_FIELD_NUMBER: _ClassVar[int]
    LEADER_ID_FIELD_NUMBER: _ClassVar[int]
    LAST_LOG_INDEX_FIELD_NUMBER: _ClassVar[int]
    COMMITTED_INDEX_FIELD_NUMBER: _ClassVar[int]
    LAST_APPLIED_INDEX_FIELD_NUMBER: _ClassVar[int]
    MEMBERS_FIELD_NUMBER: _ClassVar[int]
    VERSION_FIELD_NUMBER: _ClassVar[int]
    node_id: int
    role: str
    term: int
    leader_id: int
    last_log_index: int
    committed_index: int
    last_applied_index: int
    members: _containers.RepeatedCompositeFieldContainer[ClusterMember]
    version: str
    def __init__(self, node_id: _Optional[int] = ..., role: _Optional[str] = ..., term: _Optional[int] = ..., leader_id: _Optional[int] = ..., last_log_index: _Optional[int] = ..., committed_index: _Optional[int] = ..., last_applied_index: _Optional[int] = ..., members: _Optional[_Iterable[_Union[ClusterMember, _Mapping]]] = ..., version: _Optional[str] = ...) -> None: ...

class ClusterMember(_message.Message):
    __slots__ = ("node_id", "client_addr", "peer_addr", "voter", "matched_index", "lag", "replication_known", "unreachable_micro")
    NODE_ID_FIELD_NUMBER: _ClassVar[int]
    CLIENT_ADDR_FIELD_NUMBER: _ClassVar[int]
    PEER_ADDR_FIELD_NUMBER: _ClassVar[int]
    VOTER_FIELD_NUMBER: _ClassVar[int]
    MATCHED_INDEX_FIELD_NUMBER: _ClassVar[int]
    LAG_FIELD_NUMBER: _ClassVar[int]
    REPLICATION_KNOWN_FIELD_NUMBER: _ClassVar[int]
    UNREACHABLE_MICRO_FIELD_NUMBER: _ClassVar[int]
    node_id: int
    client_addr: str
    peer_addr: str
    voter: bool
    matched_index: int
    lag: int
    replication_known: bool
    unreachable_micro: int
    def __init__(self, node_id: _Optional[int] = ..., client_addr: _Optional[str] = ..., peer_addr: _Optional[str] = ..., voter: bool = ..., matched_index: _Optional[int] = ..., lag: _Optional[int] = ..., replication_known: bool = ..., unreachable_micro: _Optional[int] = ...) -> None: ...

class RequestLock(_message.Message):
    __slots__ = ("wait_micro", "release_micro", "keys", "try_lock", "fence", "shared_keys", "limit", "ticket", "value")
    WAIT_MICRO_FIELD_NUMBER: _ClassVar[int]
    RELEASE_MICRO_FIELD_NUMBER: _ClassVar[int]
    KEYS_FIELD_NUMBER: _ClassVar[int]
    TRY_LOCK_FIELD_NUMBER: _ClassVar[int]
    FENCE_FIELD_NUMBER: _ClassVar[int]
    SHARED_KEYS_FIELD_NUMBER: _ClassVar[int]
    LIMIT_FIELD_NUMBER: _ClassVar[int]
    TICKET_FIELD_NUMBER: _ClassVar[int]
    VALUE_FIELD_NUMBER: _ClassVar[int]
    wait_micro: int
    release_micro: int
    keys: _containers.RepeatedScalarFieldContainer[str]
    try_lock: bool
    fence: int
    shared_keys: _containers.RepeatedScalarFieldContainer[str]
    limit: int
    ticket: int
    value: bytes
    def __init__(self, wait_micro: _Optional[int] = ..., release_micro: _Optional[int] = ..., keys: _Optional[_Iterable[str]] = ..., try_lock: bool = ..., fence: _Optional[int] = ..., shared_keys: _Optional[_Iterable[str]] = ..., limit: _Optional[int] = ..., ticket: _Optional[int] = ..., value: _Optional[bytes] = ...) -> None: ...

class KeyInfo(_message.Message):
    __slots__ = ("key", "fence", "lease_remaining_micro", "waiters", "held_by_caller", "holder_addr", "shared", "limit", "holders", "value", "held_micro", "waited_micro", "holders_omitted")
    KEY_FIELD_NUMBER: _ClassVar[int]
    FENCE_FIELD_NUMBER: _ClassVar[int]
    LEASE_REMAINING_MICRO_FIELD_NUMBER: _ClassVar[int]
    WAITERS_FIELD_NUMBER: _ClassVar[int]
    HELD_BY_CALLER_FIELD_NUMBER: _ClassVar[int]
    HOLDER_ADDR_FIELD_NUMBER: _ClassVar[int]
    SHARED_FIELD_NUMBER: _ClassVar[int]
    LIMIT_FIELD_NUMBER: _ClassVar[int]
    HOLDERS_FIELD_NUMBER: _ClassVar[int]
    VALUE_FIELD_NUMBER: _ClassVar[int]
    HELD_MICRO_FIELD_NUMBER: _ClassVar[int]
    WAITED_MICRO_FIELD_NUMBER: _ClassVar[int]
    HOLDERS_OMITTED_FIELD_NUMBER: _ClassVar[int]
    key: str
    fence: int
    lease_remaining_micro: int
    waiters: int
    held_by_caller: bool
    holder_addr: str
    shared: bool
    limit: int
    holders: _containers.RepeatedCompositeFieldContainer[KeyHolder]
    value: bytes
    held_micro: int
    waited_micro: int
    holders_omitted: int
    def __init__(self, key: _Optional[str] = ..., fence: _Optional[int] = ..., lease_remaining_micro: _Optional[int] = ..., waiters: _Optional[int] = ..., held_by_caller: bool = ..., holder_addr: _Optional[str] = ..., shared: bool = ..., limit: _Optional[int] = ..., holders: _Optional[_Iterable[_Union[KeyHolder, _Mapping]]] = ..., value: _Optional[bytes] = ..., held_micro: _Optional[int] = ..., waited_micro: _Optional[int] = ..., holders_omitted: _Optional[int] = ...) -> None: ...

class KeyHolder(_message.Message):
    __slots__ = ("fence", "lease_remaining_micro", "held_by_caller", "holder_addr", "value", "held_micro")
    FENCE_FIELD_NUMBER: _ClassVar[int]
    LEASE_REMAINING_MICRO_FIELD_NUMBER: _ClassVar[int]
    HELD_BY_CALLER_FIELD_NUMBER: _ClassVar[int]
    HOLDER_ADDR_FIELD_NUMBER: _ClassVar[int]
    VALUE_FIELD_NUMBER: _ClassVar[int]
    HELD_MICRO_FIELD_NUMBER: _ClassVar[int]
    fence: int
    lease_remaining_micro: int
    held_by_caller: bool
    holder_addr: str
    value: bytes
    held_micro: int
    def __init__(self, fence: _Optional[int] = ..., lease_remaining_micro: _Optional[int] = ..., held_by_caller: bool = ..., holder_addr: _Optional[str] = ..., value: _Optional[bytes] = ..., held_micro: _Optional[int] = ...) -> None: ...

class Response(_message.Message):
    __slots__ = ("version", "request_id", "status", "error_text", "keys", "server_unix_time", "fence", "key_info", "server_stats", "limits", "session", "session_ttl_micro", "leader_addr", "cluster", "ticket", "place")
    VERSION_FIELD_NUMBER: _ClassVar[int]
    REQUEST_ID_FIELD_NUMBER: _ClassVar[int]
    STATUS_FIELD_NUMBER: _ClassVar[int]
    ERROR_TEXT_FIELD_NUMBER: _ClassVar[int]
    KEYS_FIELD_NUMBER: _ClassVar[int]
    SERVER_UNIX_TIME_FIELD_NUMBER: _ClassVar[int]
    FENCE_FIELD_NUMBER: _ClassVar[int]
    KEY_INFO_FIELD_NUMBER: _ClassVar[int]
    SERVER_STATS_FIELD_NUMBER: _ClassVar[int]
    LIMITS_FIELD_NUMBER: _ClassVar[int]
    SESSION_FIELD_NUMBER: _ClassVar[int]
    SESSION_TTL_MICRO_FIELD_NUMBER: _ClassVar[int]
    LEADER_ADDR_FIELD_NUMBER: _ClassVar[int]
    CLUSTER_FIELD_NUMBER: _ClassVar[int]
    TICKET_FIELD_NUMBER: _ClassVar[int]
    PLACE_FIELD_NUMBER: _ClassVar[int]
    version: int
    request_id: int
    status: ResponseStatus
    error_text: str
    keys: _containers.RepeatedScalarFieldContainer[str]
    server_unix_time: int
    fence: int
    key_info: _containers.RepeatedCompositeFieldContainer[KeyInfo]
    server_stats: ServerStats
    limits: ServerLimits
    session: int
    session_ttl_micro: int
    leader_addr: str
    cluster: ClusterInfo
    ticket: int
    place: int
    def __init__(self, version: _Optional[int] = ..., request_id: _Optional[int] = ..., status: _Optional[_Union[ResponseStatus, str]] = ..., error_text: _Optional[str] = ..., keys: _Optional[_Iterable[str]] = ..., server_unix_time: _Optional[int] = ..., fence: _Optional[int] = ..., key_info: _Optional[_Iterable[_Union[KeyInfo, _Mapping]]] = ..., server_stats: _Optional[_Union[ServerStats, _Mapping]] = ..., limits: _Optional[_Union[ServerLimits, _Mapping]] = ..., session: _Optional[int] = ..., session_ttl_micro: _Optional[int] = ..., leader_addr: _Optional[str] = ..., cluster: _Optional[_Union[ClusterInfo, _Mapping]] = ..., ticket: _Optional[int] = ..., place: _Optional[int] = ...) -> None: ...

class ServerLimits(_message.Message):
    __slots__ = ("session_timeout_micro", "max_lease_micro", "max_keys", "max_key_len", "max_frame", "max_pipeline", "resumable_sessions", "election_timeout_micro")
    SESSION_TIMEOUT_MICRO_FIELD_NUMBER: _ClassVar[int]
    MAX_LEASE_MICRO_FIELD_NUMBER: _ClassVar[int]
    MAX_KEYS_FIELD_NUMBER: _ClassVar[int]
    MAX_KEY_LEN_FIELD_NUMBER: _ClassVar[int]
    MAX_FRAME_FIELD_NUMBER: _ClassVar[int]
    MAX_PIPELINE_FIELD_NUMBER: _ClassVar[int]
    RESUMABLE_SESSIONS_FIELD_NUMBER: _ClassVar[int]
    ELECTION_TIMEOUT_MICRO_FIELD_NUMBER: _ClassVar[int]
    session_timeout_micro: int
    max_lease_micro: int
    max_keys: int
    max_key_len: int
    max_frame: int
    max_pipeline: int
    resumable_sessions: bool
    election_timeout_micro: int
    def __init__(self, session_timeout_micro: _Optional[int] = ..., max_lease_micro: _Optional[int] = ..., max_keys: _Optional[int] = ..., max_key_len: _Optional[int] = ..., max_frame: _Optional[int] = ..., max_pipeline: _Optional[int] = ..., resumable_sessions: bool = ..., election_timeout_micro: _Optional[int] = ...) -> None: ...

class ServerStats(_message.Message):
    __slots__ = ("connections", "held_keys", "waiting_requests", "sessions", "grants", "handoffs", "busiest")
    CONNECTIONS_FIELD_NUMBER: _ClassVar[int]
    HELD_KEYS_FIELD_NUMBER: _ClassVar[int]
    WAITING_REQUESTS_FIELD_NUMBER: _ClassVar[int]
    SESSIONS_FIELD_NUMBER: _ClassVar[int]
    GRANTS_FIELD_NUMBER: _ClassVar[int]
    HANDOFFS_FIELD_NUMBER: _ClassVar[int]
    BUSIEST_FIELD_NUMBER: _ClassVar[int]
    connections: int
    held_keys: int
    waiting_requests: int
    sessions: int
    grants: int
    handoffs: int
    busiest: _containers.RepeatedCompositeFieldContainer[KeyInfo]
    def __init__(self, connections: _Optional[int] = ..., held_keys: _Optional[int] = ..., waiting_requests: _Optional[int] = ..., sessions: _Optional[int] = ..., grants: _Optional[int] = ..., handoffs: _Optional[int] = ..., busiest: _Optional[_Iterable[_Union[KeyInfo, _Mapping]]] = ...) -> None: ...

"""The Lua scripts of the Redis Streams request queue (``clipper.adapters.redis_streams``).

Each script runs atomically on the server: a client that dies mid-call leaves either none or all of a
script's writes, so a message is never lost between the pending list and the dead-letter stream, nor
delivered twice at once. Every key a script names is one queue's (``clipper:queue:{<name>}...``), so they
share one hash tag and one cluster slot. Times come from the server (``TIME``), the clock that also measures
a pending entry's idle time, so the readers' clocks do not matter.

State of one message (stream entry ``id``):

- undelivered: in the stream, after the group's last-delivered id;
- in flight: in the group's pending entries list (PEL), idle for less than the visibility timeout;
- released: in the PEL and in the delayed set, scored with the epoch ms at which it is visible again;
- visible again: in the PEL, idle for at least the visibility timeout (or released and due): the next
  receive claims it (``XCLAIM``, which counts one more delivery), or dead-letters it when it was already
  delivered ``max receive count`` times;
- deleted: acknowledged and removed from the stream (``XACK`` + ``XDEL``), so the stream holds only the
  messages still to be answered.
"""

from __future__ import annotations

# Shared by the scripts: the entry's body field, and the end of one message.
_COMMON = """
local function body_of(fields)
  for i = 1, #fields, 2 do
    if fields[i] == 'body' then return fields[i + 1] end
  end
  return ''
end
local function forget(stream, delayed, group, id)
  redis.call('XACK', stream, group, id)
  redis.call('XDEL', stream, id)
  redis.call('ZREM', delayed, id)
end
local function is_wake(fields)  -- a release's wake-up call to blocked readers (RELEASE), not a message
  return fields[1] == 'wake'
end
local function now_ms()
  local t = redis.call('TIME')
  return tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)
end
"""

# RECEIVE
# KEYS: stream, delayed set, dead-letter stream.
# ARGV: group, consumer, max messages, visibility timeout ms, max receive count, dead-letter stream max
#       length (approximate), "1" to compute the wait hint when nothing is ready.
# Creates the group (from the stream's first entry, MKSTREAM) when it is missing. Then, up to max messages:
#   1. entries visible again after their visibility timeout (not released), oldest id first,
#   2. released entries that are due,
#   3. new entries (XREADGROUP >, not blocking: a script cannot block).
# A visible-again entry already delivered max receive count times is moved instead: XADD to the dead-letter
# stream (fields body, source_id, receive_count) and deleted from the stream, the PEL and the delayed set.
# Returns {hint_ms, dead_lettered, id1, body1, count1, id2, ...}: count is the delivery count including this
# one; hint_ms (only when nothing was returned and the hint was asked for, else 0) is how long until a pending
# entry can be visible again (-1: none pending), from a scan of at most 256 pending entries (capped at 1000
# when there are more).
RECEIVE = (
    _COMMON
    + """
local stream, delayed, dlq = KEYS[1], KEYS[2], KEYS[3]
local group, consumer = ARGV[1], ARGV[2]
local want, vis, max_rc = tonumber(ARGV[3]), tonumber(ARGV[4]), tonumber(ARGV[5])
local now = now_ms()
local out = {0, 0}
local got = 0

local function take(id, count)
  redis.call('ZREM', delayed, id)
  if count >= max_rc then
    local e = redis.call('XRANGE', stream, id, id)[1]
    if e and not is_wake(e[2]) then  -- a wake-up is dropped, never dead-lettered
      redis.call('XADD', dlq, 'MAXLEN', '~', ARGV[6], '*', 'body', body_of(e[2]), 'source_id', id,
        'receive_count', count)
      out[2] = out[2] + 1
    end
    forget(stream, delayed, group, id)
    return
  end
  local e = redis.call('XCLAIM', stream, group, consumer, 0, id)[1]
  if e and is_wake(e[2]) then
    forget(stream, delayed, group, id)  -- a wake-up whose reader died before it acknowledged it
  elseif e then
    got = got + 1
    out[#out + 1] = id
    out[#out + 1] = body_of(e[2])
    out[#out + 1] = count + 1
  else
    forget(stream, delayed, group, id)  -- its entry is gone (retention): drop the pending entry
  end
end

local scan = want + redis.call('ZCARD', delayed)
local expired = redis.pcall('XPENDING', stream, group, 'IDLE', vis, '-', '+', scan)
if type(expired) == 'table' and expired['err'] then
  redis.pcall('XGROUP', 'CREATE', stream, group, '0', 'MKSTREAM')
  expired = redis.call('XPENDING', stream, group, 'IDLE', vis, '-', '+', scan)
end
for _, p in ipairs(expired) do
  if got >= want then break end
  if not redis.call('ZSCORE', delayed, p[1]) then take(p[1], p[4]) end
end
if got < want then
  for _, id in ipairs(redis.call('ZRANGEBYSCORE', delayed, '-inf', now, 'LIMIT', 0, want - got)) do
    local p = redis.call('XPENDING', stream, group, id, id, 1)[1]
    if p then take(id, p[4]) else redis.call('ZREM', delayed, id) end
  end
end
if got < want then
  local r = redis.call('XREADGROUP', 'GROUP', group, consumer, 'COUNT', want - got, 'STREAMS', stream, '>')
  if r then
    for _, e in ipairs(r[1][2]) do
      if is_wake(e[2]) then
        forget(stream, delayed, group, e[1])  -- this scan is what the wake-up asked for
      else
        got = got + 1
        out[#out + 1] = e[1]
        out[#out + 1] = body_of(e[2])
        out[#out + 1] = 1
      end
    end
  end
end
if got == 0 and ARGV[7] == '1' then
  local hint = -1
  local first = redis.call('ZRANGE', delayed, 0, 0, 'WITHSCORES')
  if first[2] then hint = math.max(0, tonumber(first[2]) - now) end
  local pending = redis.call('XPENDING', stream, group, '-', '+', 256)
  for _, p in ipairs(pending) do
    if not redis.call('ZSCORE', delayed, p[1]) then
      local d = math.max(0, vis - p[3])
      if hint < 0 or d < hint then hint = d end
    end
  end
  if #pending == 256 and (hint < 0 or hint > 1000) then hint = 1000 end
  out[1] = hint
end
return out
"""
)

# RELEASE
# KEYS: stream, delayed set. ARGV: group, entry id, the handle's delivery count, delay ms, "1" to wake readers.
# When the entry is still pending with that delivery count (the handle's delivery is the current one), it is
# scored in the delayed set at now + delay: visible again from then on, its delivery count unchanged (the
# receive that claims it counts one more). Returns 1; 0 for a stale handle (the message was deleted, or
# delivered again since: its current holder keeps it). With "1" (a release at once: a stopping batcher hands
# its messages back) it also adds a wake-up entry (field ``wake``) to the stream: a reader blocked in
# XREADGROUP for new entries gets it at once, drops it and scans, instead of finding the message at its next
# scan up to ``RESCAN_S`` later (past the deadline of a query with a short SLO). Until a reader takes it, the
# wake-up counts as one ready message in DEPTH.
RELEASE = (
    _COMMON
    + """
local stream, delayed = KEYS[1], KEYS[2]
local p = redis.pcall('XPENDING', stream, ARGV[1], ARGV[2], ARGV[2], 1)
if type(p) ~= 'table' or p['err'] or not p[1] or tostring(p[1][4]) ~= ARGV[3] then return 0 end
redis.call('ZADD', delayed, now_ms() + tonumber(ARGV[4]), ARGV[2])
if ARGV[5] == '1' then redis.call('XADD', stream, '*', 'wake', '1') end
return 1
"""
)

# DEPTH
# KEYS: stream, delayed set, dead-letter stream. ARGV: group, visibility timeout ms.
# Returns {ready, in_flight, delayed, dead_lettered}: ready = undelivered + visible again (expired or
# released and due); in flight = pending and neither; delayed = released and not yet due; dead-lettered =
# the dead-letter stream's length. Scans at most 100,000 pending entries (an operator's view, not a hot path).
DEPTH = (
    _COMMON
    + """
local stream, delayed, dlq = KEYS[1], KEYS[2], KEYS[3]
local now = now_ms()
local length = redis.call('XLEN', stream)
local released = redis.call('ZCARD', delayed)
local later = redis.call('ZCOUNT', delayed, '(' .. now, '+inf')
local pending, expired = 0, 0
local summary = redis.pcall('XPENDING', stream, ARGV[1])
if type(summary) == 'table' and not summary['err'] then
  pending = summary[1]
  for _, p in ipairs(redis.call('XPENDING', stream, ARGV[1], 'IDLE', ARGV[2], '-', '+', 100000)) do
    if not redis.call('ZSCORE', delayed, p[1]) then expired = expired + 1 end
  end
end
local ready = math.max(0, length - pending) + expired + (released - later)
return {ready, math.max(0, pending - expired - released), later, redis.call('XLEN', dlq)}
"""
)

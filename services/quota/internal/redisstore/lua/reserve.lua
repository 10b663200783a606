-- reserve: charge a group's buckets (and a tenant's budget), all or nothing, and record
-- the reservation.
--
-- K1 the group's hash.
-- ARGV: now s, now ns (false for Redis TIME), maxdebt, n, then n x (field, cost as the
-- time the bucket takes to refill it in ns, shadow 0|1), then budget cost (-1 for
-- none), limit, day offset (s), shadow 0|1, then, to record the reservation: ttl (ns),
-- record tail, record field. Numbers are numbers (batch.lua).
--
-- The record is a field of the group's hash (prelude.lua: records), not a key of its
-- own: one write fewer here, one lookup fewer in settle.
--
-- Returns {granted 0|1, s, ns, n x (wait, debt, flag), budget (spent, reset, flag)}:
-- flag 1 is an enforced bucket that is short (refused), 2 a shadow bucket that is short
-- (not charged); debt is after the charge when granted.
local key = K1
local s, ns = clock(ARGV[1], ARGV[2])
local maxdebt = ARGV[3]
local n = ARGV[4]
local bi = 4 + n * 3
local bcost = ARGV[bi + 1]
local rfield = ARGV[bi + 7]

-- One read for everything: the buckets, then budget day, spending and expiry second.
local fields = {}
for i = 1, n do
  fields[i] = ARGV[4 + (i - 1) * 3 + 1]
end
fields[n + 1], fields[n + 2], fields[n + 3], fields[n + 4], fields[n + 5] = 'bd', 'bs', 'x', 'sw', 'sc'
local v = redis.call('HMGET', key, unpack(fields))
local x = tonumber(v[n + 3] or 0)

local out = {0, s, ns}
local refused = false
-- Per bucket, out holds wait, debt, flag; sum holds debt + cost, what a charge leaves.
local sum = {}
for i = 1, n do
  local b = 4 + (i - 1) * 3
  local d = debtOf(v[i], s, ns)
  -- The caller converts the cost to time (bucket.go: durationOf): the same numbers,
  -- without the long division in Lua, which was the script's largest cost.
  local dc = d + ARGV[b + 2]
  local wait, flag = dc - W, 0
  if wait > 0 then
    if ARGV[b + 3] == 1 then
      flag = 2
    else
      flag = 1
      refused = true
    end
  else
    wait = 0
  end
  sum[i] = dc
  local o = 3 + (i - 1) * 3
  out[o + 1], out[o + 2], out[o + 3] = wait, d, flag
end

local day, spent, breset, bflag = 0, 0, 0, 0
if bcost >= 0 then
  day, breset = budgetDay(s, ns, ARGV[bi + 3])
  if tonumber(v[n + 1] or -1) == day then
    spent = tonumber(v[n + 2])
  end
  if spent + bcost > ARGV[bi + 2] then
    if ARGV[bi + 4] == 1 then
      bflag = 2
    else
      bflag = 1
      refused = true
    end
  end
end
out[#out + 1] = spent
out[#out + 1] = breset
out[#out + 1] = bflag
if refused then
  return out
end

out[1] = 1
local untilS = s
local sets, dels, mask = {}, {}, ''
for i = 1, n do
  local o = 3 + (i - 1) * 3
  if out[o + 3] == 0 then
    local d = math.min(sum[i], maxdebt)
    local stampV, full = fullAt(s, ns, d)
    if stampV then
      sets[#sets + 1] = fields[i]
      sets[#sets + 1] = stampV
    elseif v[i] then
      dels[#dels + 1] = fields[i]
    end
    untilS = math.max(untilS, full)
    out[o + 2] = d
    mask = mask .. '1'
  else
    mask = mask .. '0'
  end
end
local bday = '-'
if bcost >= 0 then
  if bflag == 0 then
    spent = spent + bcost
    bday = string.format('%d', day)
  end
  sets[#sets + 1] = 'bd'
  sets[#sets + 1] = string.format('%d', day)
  sets[#sets + 1] = 'bs'
  sets[#sets + 1] = string.format('%d', spent)
  out[3 + n * 3 + 1] = spent
  untilS = math.max(untilS, s + math.ceil(breset / E9))
end
if rfield then
  -- The record: expiry | charged mask | budget day ('-' when not charged) | tail, where
  -- the caller's tail is tokens | budget | buckets | meta (see settle.lua).
  local es, ens = idiv(ns + ARGV[bi + 5], E9)
  es = s + es
  sets[#sets + 1] = rfield
  sets[#sets + 1] = string.format('%d:%d|', es, ens) .. mask .. '|' .. bday .. '|' .. ARGV[bi + 6]
  -- The hash outlives the record by a minute, as the record's own key did.
  untilS = math.max(untilS, es + 1)
  sweepRecords(key, s, v[n + 4], v[n + 5], rfield, sets, dels)
end
save(key, s, sets, dels, untilS, x)
return out

-- Shared by every quota operation. Numbers in Redis's Lua are IEEE doubles, exact for
-- integers below 2^53 (about 104 days in nanoseconds). So instants are kept as seconds
-- plus nanoseconds ("sec:nsec"), durations stay below maxdebt (30 days), and the one
-- product that would overflow, tokens x window, is formed by long division. This keeps
-- every decision identical to memstore.Store's, to the nanosecond.
local W = 60000000000 -- the bucket window, one minute, in ns
local E9 = 1000000000

-- idiv returns floor(a / b) and the remainder, for non-negative integers below 2^53.
local function idiv(a, b)
  local q = math.floor(a / b)
  local r = a - q * b
  if r < 0 then
    q = q - 1
    r = r + b
  elseif r >= b then
    q = q + 1
    r = r - b
  end
  return q, r
end

-- dur returns ceil(n * W / L): how long a bucket of limit L takes to refill n tokens,
-- saturating at maxdebt (bucket.go: durationOf).
local function dur(n, L, maxdebt)
  if n <= 0 then
    return 0
  end
  -- Below 2^53 the product n * W is exact, and so is ceil of the rounded quotient: a
  -- quotient that is not whole is at least 1/L from the next whole number, more than
  -- the rounding error (at most n * W / L / 2^53). This is most calls (n up to 150,000).
  local nw = n * W
  if nw < 9007199254740992 then
    return math.min(math.ceil(nw / L), maxdebt)
  end
  local q, r = idiv(n, L)
  if q * W >= maxdebt then
    return maxdebt
  end
  -- r * 60e9 / L, one factor at a time: 60, then 1000 three times.
  local f, m = idiv(r * 60, L)
  for _ = 1, 3 do
    local d
    d, m = idiv(m * 1000, L)
    f = f * 1000 + d
  end
  if m > 0 then
    f = f + 1
  end
  return math.min(q * W + f, maxdebt)
end

-- now_s and now_ns are Redis's TIME, read once per call of batch (batch.lua) and shared
-- by its operations: they run at one point in time anyway, and TIME from Lua costs
-- about 1 µs. batch clears them first, since a function library's upvalues outlive
-- a call.
local now_s, now_ns

-- clock returns the decision time: the caller's when given (tests pin it to a fake
-- clock), Redis's TIME otherwise (s is false), so that every replica decides on one
-- clock.
local function clock(s, ns)
  if not s then
    if not now_s then
      local t = redis.call('TIME')
      now_s, now_ns = tonumber(t[1]), tonumber(t[2]) * 1000
    end
    return now_s, now_ns
  end
  return s, ns
end

-- debtOf returns how long a bucket full again at v ("sec:nsec"; false when the field is
-- missing, which is a full bucket) still needs at (s, ns).
local function debtOf(v, s, ns)
  if not v then
    return 0
  end
  local i = string.find(v, ':', 1, true)
  local d = (tonumber(string.sub(v, 1, i - 1)) - s) * E9 + (tonumber(string.sub(v, i + 1)) - ns)
  if d < 0 then
    return 0
  end
  return d
end

-- stamp formats (s, ns) + d as "sec:nsec". (string.format, not concatenation: Lua
-- writes a number it concatenates with %.14g, which costs more than %d here.)
local function stamp(s, ns, d)
  local q, r = idiv(ns + d, E9)
  return string.format('%d:%d', s + q, r)
end

-- fullAt formats when a bucket with debt d at (s, ns) is full again, for HSET; false
-- (HDEL) when it is full already. It also returns that second, for expiry.
local function fullAt(s, ns, d)
  if d <= 0 then
    return false, s
  end
  return stamp(s, ns, d), s + math.ceil(d / E9)
end

-- save writes a group's changed fields in one HSET (and HDEL for buckets that are full
-- again) and makes the hash outlive every bucket in it that may still be in debt: field
-- x holds the latest such second, and the expiry (x plus a window of slack) is only
-- moved when x grows, since it is an absolute point in time.
local function save(key, s, sets, dels, untilS, x)
  if untilS > x then
    sets[#sets + 1] = 'x'
    sets[#sets + 1] = string.format('%d', untilS)
  end
  if #sets > 0 then
    redis.call('HSET', key, unpack(sets))
  end
  if #dels > 0 then
    redis.call('HDEL', key, unpack(dels))
  end
  if untilS > x then
    redis.call('PEXPIRE', key, (untilS - s + 61) * 1000)
  end
end

-- Reservation records are fields of their tenant's hash: "r|<id>" (a bucket field never
-- holds '|', see escapeField) whose value starts with the record's expiry "sec:nsec".
-- Redis 7.0 expires keys, not fields, so settle refuses an expired record itself and a
-- record nobody settles stays until the hash expires, or until sweepRecords deletes
-- it: every SWEEP seconds, reserves scan the hash, one HSCAN step of about 100 fields
-- each (field sc keeps the cursor, sw when the next scan is due), and delete the
-- records that expired in an earlier second, except keep, the one being written. A
-- hash with no sw yet has no records.
local SWEEP = 60

local function sweepRecords(key, s, sw, sc, keep, sets, dels)
  if not sw then
    sets[#sets + 1] = 'sw'
    sets[#sets + 1] = string.format('%d', s + SWEEP)
    return
  end
  if s < tonumber(sw) then
    return
  end
  local r = redis.call('HSCAN', key, sc or '0', 'MATCH', 'r|*', 'COUNT', 100)
  local kv = r[2]
  for j = 1, #kv, 2 do
    local es = tonumber(string.match(kv[j + 1], '^(%d+):'))
    if es and es < s and kv[j] ~= keep then
      dels[#dels + 1] = kv[j]
    end
  end
  sets[#sets + 1] = 'sc'
  sets[#sets + 1] = r[1]
  if r[1] == '0' then
    sets[#sets + 1] = 'sw'
    sets[#sets + 1] = string.format('%d', s + SWEEP)
  end
end

-- budgetDay returns the budget day (s, ns) falls in and the ns until the next one.
local function budgetDay(s, ns, off)
  local day = idiv(s + off, 86400)
  return day, ((day + 1) * 86400 - off - s) * E9 - ns
end

-- reserve: charge a group's buckets (and a tenant's budget), all or nothing, and record
-- the reservation.
--
-- KEYS[1] the group's hash; KEYS[2], when given, the reservation's key.
-- ARGV: now s, now ns ('' for Redis TIME), maxdebt, n, then n x (field, cost, limit,
-- shadow 0|1), then budget cost (-1 for none), limit, day offset (s), shadow, then with
-- KEYS[2]: ttl (ns), record tail.
--
-- Returns {granted 0|1, s, ns, n x (wait, debt, flag), budget (spent, reset, flag)}:
-- flag 1 is an enforced bucket that is short (refused), 2 a shadow bucket that is short
-- (not charged); debt is after the charge when granted.
local key = KEYS[1]
local s, ns = clock(ARGV[1], ARGV[2])
local maxdebt = tonumber(ARGV[3])
local n = tonumber(ARGV[4])
local out = {0, s, ns}
local refused = false
local debts, costs, flags = {}, {}, {}
for i = 1, n do
  local b = 4 + (i - 1) * 4
  local cost, limit = tonumber(ARGV[b + 2]), tonumber(ARGV[b + 3])
  local d = debtOf(redis.call('HGET', key, ARGV[b + 1]), s, ns)
  local c = dur(cost, limit, maxdebt)
  local wait, flag = d + c - W, 0
  if wait > 0 then
    if ARGV[b + 4] == '1' then
      flag = 2
    else
      flag = 1
      refused = true
    end
  else
    wait = 0
  end
  debts[i], costs[i], flags[i] = d, c, flag
  out[#out + 1] = wait
  out[#out + 1] = d
  out[#out + 1] = flag
end

local bi = 4 + n * 4
local bcost = tonumber(ARGV[bi + 1])
local day, spent, breset, bflag = 0, 0, 0, 0
if bcost >= 0 then
  day, breset = budgetDay(s, ns, tonumber(ARGV[bi + 3]))
  if tonumber(redis.call('HGET', key, 'bd') or -1) == day then
    spent = tonumber(redis.call('HGET', key, 'bs'))
  end
  if spent + bcost > tonumber(ARGV[bi + 2]) then
    if ARGV[bi + 4] == '1' then
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
local mask = {}
for i = 1, n do
  if flags[i] == 0 then
    local d = math.min(debts[i] + costs[i], maxdebt)
    untilS = math.max(untilS, put(key, ARGV[4 + (i - 1) * 4 + 1], s, ns, d))
    out[3 + (i - 1) * 3 + 2] = d
    mask[i] = '1'
  else
    mask[i] = '0'
  end
end
local bday = '-'
if bcost >= 0 then
  if bflag == 0 then
    spent = spent + bcost
    bday = string.format('%d', day)
  end
  redis.call('HSET', key, 'bd', string.format('%d', day), 'bs', string.format('%d', spent))
  out[3 + n * 3 + 1] = spent
  untilS = math.max(untilS, s + math.ceil(breset / E9))
end
keep(key, s, untilS)

if #KEYS == 2 then
  -- The record: expiry | charged mask | budget day ('-' when not charged) | tail, where
  -- the caller's tail is tokens | budget | buckets | meta (see settle.lua).
  local ttl = tonumber(ARGV[bi + 5])
  redis.call('SET', KEYS[2], stamp(s, ns, ttl) .. '|' .. table.concat(mask) .. '|' .. bday .. '|' .. ARGV[bi + 6],
    'PX', math.floor(ttl / 1000000) + 60000)
end
return out

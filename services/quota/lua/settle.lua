-- settle: correct the buckets a reservation charged by its actual usage, or return
-- everything (release), and delete the reservation.
--
-- KEYS[1] the tenant group's hash; KEYS[2] the reservation's key.
-- ARGV: now s, now ns, maxdebt, actual tokens, actual input, actual output, release 0|1.
--
-- The record is: expiry "s:ns" | charged mask | budget day or '-' | tokens | budget
-- "cost,input price,output price,day offset" or '-' | buckets
-- "field,kind,cost,limit,shadow" joined by ';' | meta (opaque to this script).
--
-- Returns {0} when the reservation is missing or expired, else {1, s, ns, tokens, cost,
-- spent (-1 without budget), budget reset, meta, buckets, mask, debt of each charged
-- bucket}.
local key = KEYS[1]
local s, ns = clock(ARGV[1], ARGV[2])
local maxdebt = tonumber(ARGV[3])
local rec = redis.call('GET', KEYS[2])
if not rec then
  return {0}
end
redis.call('DEL', KEYS[2])
local r = split(rec, '|')
local e = split(r[1], ':')
local es, ens = tonumber(e[1]), tonumber(e[2])
if s > es or (s == es and ns >= ens) then
  return {0}
end

local release = ARGV[7] == '1'
local actual = tonumber(ARGV[4])
if release then
  actual = 0
end
local out = {1, s, ns, tonumber(r[4]), 0, -1, 0, r[7], r[6], r[2]}
local untilS = s
if r[6] ~= '' then
  for i, spec in ipairs(split(r[6], ';')) do
    if string.sub(r[2], i, i) == '1' then
      local f = split(spec, ',')
      local cost, limit = tonumber(f[3]), tonumber(f[4])
      local delta = 0
      if release then
        delta = -cost
      elseif f[2] == 't' then
        delta = actual - cost
      end
      local d = debtOf(redis.call('HGET', key, f[1]), s, ns)
      if delta > 0 then
        d = math.min(d + dur(delta, limit, maxdebt), maxdebt)
      elseif delta < 0 then
        d = math.max(d - dur(-delta, limit, maxdebt), 0)
      end
      untilS = math.max(untilS, put(key, f[1], s, ns, d))
      out[#out + 1] = d
    end
  end
end

if r[3] ~= '-' then
  local b = split(r[5], ',')
  local bcost, pin, pout = tonumber(b[1]), tonumber(b[2]), tonumber(b[3])
  local cost = 0
  if not release then
    local ain, aout = tonumber(ARGV[5]), tonumber(ARGV[6])
    if ain + aout == 0 then
      cost = actual * math.max(pin, pout)
    else
      cost = ain * pin + aout * pout
    end
  end
  local day, reset = budgetDay(s, ns, tonumber(b[4]))
  local spent = 0
  if tonumber(redis.call('HGET', key, 'bd') or -1) == day then
    spent = tonumber(redis.call('HGET', key, 'bs'))
  end
  -- Spending from an earlier day is history: that day's counter is gone.
  if tonumber(r[3]) == day then
    spent = math.max(spent + cost - bcost, 0)
    redis.call('HSET', key, 'bd', string.format('%d', day), 'bs', string.format('%d', spent))
  end
  out[5], out[6], out[7] = cost, spent, reset
end
keep(key, s, untilS)
return out

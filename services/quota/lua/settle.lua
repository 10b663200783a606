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
-- GETDEL (Redis 6.2) is one call where GET and DEL were two; a server without it gets
-- those two.
local rec = redis.pcall('GETDEL', KEYS[2])
if type(rec) == 'table' and rec.err then
  rec = redis.call('GET', KEYS[2])
  if rec then
    redis.call('DEL', KEYS[2])
  end
end
if not rec then
  return {0}
end
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

-- The charged buckets, then budget day, spending and expiry second, in one read.
local specs, fields = {}, {}
if r[6] ~= '' then
  for i, spec in ipairs(split(r[6], ';')) do
    if string.sub(r[2], i, i) == '1' then
      local f = split(spec, ',')
      specs[#specs + 1] = f
      fields[#fields + 1] = f[1]
    end
  end
end
local m = #fields
fields[m + 1], fields[m + 2], fields[m + 3] = 'bd', 'bs', 'x'
local v = redis.call('HMGET', key, unpack(fields))
local x = tonumber(v[m + 3] or 0)

local untilS = s
local sets, dels = {}, {}
for i, f in ipairs(specs) do
  local cost, limit = tonumber(f[3]), tonumber(f[4])
  local delta = 0
  if release then
    delta = -cost
  elseif f[2] == 't' then
    delta = actual - cost
  end
  local d = debtOf(v[i], s, ns)
  if delta > 0 then
    d = math.min(d + dur(delta, limit, maxdebt), maxdebt)
  elseif delta < 0 then
    d = math.max(d - dur(-delta, limit, maxdebt), 0)
  end
  local stampV, full = fullAt(s, ns, d)
  if stampV then
    sets[#sets + 1] = f[1]
    sets[#sets + 1] = stampV
  elseif v[i] then
    dels[#dels + 1] = f[1]
  end
  untilS = math.max(untilS, full)
  out[#out + 1] = d
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
  if tonumber(v[m + 1] or -1) == day then
    spent = tonumber(v[m + 2])
  end
  -- Spending from an earlier day is history: that day's counter is gone.
  if tonumber(r[3]) == day then
    spent = math.max(spent + cost - bcost, 0)
    sets[#sets + 1] = 'bd'
    sets[#sets + 1] = string.format('%d', day)
    sets[#sets + 1] = 'bs'
    sets[#sets + 1] = string.format('%d', spent)
  end
  out[5], out[6], out[7] = cost, spent, reset
end
save(key, s, sets, dels, untilS, x)
return out

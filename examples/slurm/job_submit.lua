-- job_submit.lua for a Slurm cluster whose GPU partitions gpufair schedules through its Slurm
-- bridge: put it next to slurm.conf and set JobSubmitPlugins=lua (checked on Slurm 22.05).
--
-- 1. Every job of those partitions is submitted held (priority 0), so Slurm never starts one by
--    itself: the bridge pins it where gpufair places it, then releases it.
-- 2. A hold by the job's owner is recorded where the bridge sees it. The job is held already
--    (1.), and Slurm ignores a hold of a held job by anyone but an operator: it records nothing.
--    So the owner's `scontrol hold` (or `uhold`) of a pending job also sets the job's begin time
--    to USER_HOLD_BEGIN, which Slurm keeps, the owner may set too, and the bridge reads as "held
--    by its user": it withdraws the job from gpufair and never releases it.
-- 3. A release (`scontrol release`) of a held pending job sets its begin time to now, which
--    hands it back to gpufair. The owner's release leaves the job held (its priority stays 0),
--    so gpufair places it, not Slurm (of a job an operator held, the release is then a no-op
--    instead of Slurm's refusal); an operator's release is Slurm's own.

-- The partitions the bridge maps (its `partitions`), and the uids whose holds and releases are
-- an operator's (root, SlurmUser, the bridge's user).
local GPUFAIR_PARTITIONS = {gpu = true}
local OPERATORS = {[0] = true}
local HOLD_AT_SUBMIT = true
-- 2100-01-01T00:00:00Z: the begin time that means "held by its user" (the bridge's
-- USER_HOLD_BEGIN_S).
local USER_HOLD_BEGIN = 4102444800
local JOB_PENDING = 0

local function gpufair_partition(partitions)
   for name in string.gmatch(partitions or "", "[^,]+") do
      if GPUFAIR_PARTITIONS[name] then
         return true
      end
   end
   return false
end

function slurm_job_submit(job_desc, part_list, submit_uid)
   if HOLD_AT_SUBMIT and gpufair_partition(job_desc.partition) then
      job_desc.priority = 0
   end
   return slurm.SUCCESS
end

function slurm_job_modify(job_desc, job_rec, part_list, modify_uid)
   if job_rec.job_state % 256 ~= JOB_PENDING or not gpufair_partition(job_rec.partition) then
      return slurm.SUCCESS
   end
   local by_owner = modify_uid == job_rec.user_id and not OPERATORS[modify_uid]
   if job_desc.priority == 0 and by_owner then
      job_desc.begin_time = USER_HOLD_BEGIN
   elseif job_desc.priority == slurm.INFINITE and job_rec.priority == 0 then
      job_desc.begin_time = os.time()
      if by_owner then
         job_desc.priority = 0
      end
   end
   return slurm.SUCCESS
end
